"""Terminal rendering of `vramlab plan`: the component table, limits, safe point and verdict.

Plain aligned text (no rich): `plan` runs in loops and scripts and must start fast.
"""

from __future__ import annotations

from typing import Any

from vramlab.capacity.estimate import Estimate
from vramlab.capacity.gpus import GPU, HOST_DEVICE
from vramlab.capacity.planning import Plan, SweepResult
from vramlab.capacity.spec import ModelSpec
from vramlab.capacity.verdict import AT_ESTIMATE, DOES_NOT_FIT, FITS, PARTIAL_OFFLOAD, Verdict
from vramlab.units import gib


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for r in [header, *rows]:
        cells = [str(c).rjust(widths[i]) if i in right else str(c).ljust(widths[i]) for i, c in enumerate(r)]
        out.append("  ".join(cells).rstrip())
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


# Where the plan's memory is: a card's, or the host's for a CPU engine (--gpu cpu): (size, total, headroom, KV)
_WHERE = {
    False: ("usable per GPU", "per GPU at steady state", "left on the card", "on this GPU"),
    True: (
        "of host memory; a CPU engine, no CUDA context",
        "host memory at steady state",
        "left on the host",
        "in host memory",
    ),
}


def _where(e: Estimate) -> tuple[str, str, str, str]:
    return _WHERE[e.gpu == HOST_DEVICE]


def render_plan(plan: Plan, model: ModelSpec, gpu: GPU) -> str:
    e = plan.estimate
    lines = _heading(plan, model, gpu) + [""] + _components(e) + [""] + _pool(e)
    lines += _concurrency(plan) + _prefix(plan)
    lines.append(_safe_line(plan))
    lines += _placement(e) + _draft_and_host_tier(e)
    lines += [f"note: {note}" for note in e.notes]
    lines.append("")
    lines += _verdict(plan.verdict)
    return "\n".join(lines)


def _heading(plan: Plan, model: ModelSpec, gpu: GPU) -> list[str]:
    e = plan.estimate
    s = e.settings
    lines = [
        f"{model.name} on {gpu.name} ({gib(e.gpu_memory_bytes)} GiB {_where(e)[0]}) with {e.engine} {e.engine_version}"
        + (f" [{s['engine_mode']}]" if "engine_mode" in s else ""),
        "settings: " + ", ".join(f"{k}={v}" for k, v in s.items() if v is not None and k != "engine_mode"),
        f"model facts: {model.source or 'given'}"
        + (f"; weights from {model.weights_source}" if model.weights_source else ""),
    ]
    if plan.calibration:
        lines.append(f"calibration: {plan.calibration}")
    return lines


def _components(e: Estimate) -> list[str]:
    rows = [
        [
            c.name,
            gib(c.bytes),
            f"{gib(c.low_bytes)}-{gib(c.high_bytes)}",
            "yes" if c.in_budget else "no",
            c.provenance,
            c.note,
        ]
        for c in e.components
    ]
    rows.append(["total used", gib(e.used_bytes), "", "", "", _where(e)[1]])
    rows.append(["headroom", gib(e.headroom_bytes), "", "", "", _where(e)[2]])
    return _table(
        ["component", "GiB", "band GiB", "budget", "provenance", "where the error comes from"], rows, {1, 2}
    )


def _pool(e: Estimate) -> list[str]:
    lines = [
        f"KV pool: {gib(e.kv_cache_bytes)} GiB = {e.kv_cache_tokens:,} tokens"
        + (f" ({e.num_blocks:,} blocks of {e.block_size})" if e.block_size > 1 and e.engine == "vllm" else "")
        + f"; {e.kv_bytes_per_token:,} B per token {_where(e)[3]}"
    ]
    lines += _kv_band(e)
    if e.per_sequence_state_bytes:
        lines.append(f"recurrent state: {e.per_sequence_state_bytes / (1 << 20):.1f} MiB per sequence")
    conc = f"max concurrency at {e.max_model_len:,} tokens: {e.max_concurrency:.2f}"
    if e.pessimistic and e.optimistic and e.engine not in ("llama.cpp",):
        conc += f" (band {e.pessimistic.max_concurrency:.2f}-{e.optimistic.max_concurrency:.2f})"
    lines.append(conc)
    return lines


def _prefix(plan: Plan) -> list[str]:
    p = plan.prefix
    if p is None:
        return []
    head = f"prefix sharing: {p.shared_tokens:,} of {p.request_tokens:,} tokens shared by every request"
    if not p.shared_blocks:
        return [f"{head}: no more users ({p.why}): {p.users_without:.2f} requests fit"]
    more = p.users_with / p.users_without - 1 if p.users_without else 0.0
    return [
        f"{head}: {p.users_without:.2f} -> {p.users_with:.2f} requests fit (+{p.more_users:.2f}, +{more:.0%}): "
        f"{p.shared_blocks} blocks of {p.block_size} held once ({p.why})"
    ]


def _serial(e: Estimate) -> bool:
    """transformers serve without --continuous-batching answers one request at a time."""
    return e.engine == "transformers" and not (e.settings or {}).get("continuous_batching", True)


def _concurrency(plan: Plan) -> list[str]:
    if plan.concurrency is None:
        return []
    longest = plan.max_model_len_at_concurrency
    if _serial(plan.estimate) and plan.concurrency > 1 and not longest:
        # the limit is the server, not the memory: it answers one request at a time
        return [
            f"largest max_model_len for {plan.concurrency} concurrent sequences: none — not for "
            "lack of memory: transformers serve answers one request at a time without "
            "--continuous-batching (serial serving)"
        ]
    return [
        f"largest max_model_len for {plan.concurrency} concurrent sequences: "
        + (f"{longest:,}" if longest else "none fits")
    ]


def _seqs(n: int) -> str:
    return f"{n} sequence" + ("" if n == 1 else "s")


def _safe_line(plan: Plan) -> str:
    e, safe = plan.estimate, plan.safe
    head = f"safe operating point ({safe['margin']:.0%} margin, every band at its pessimistic end): "
    if "offload_layers" in safe:
        # Ollama sizes the offload itself: the margin moves layers to the CPU, it never stops the model
        return head + (
            f"Ollama would offload {safe['offload_layers']} of {safe['layers_model']} layers with "
            f"{safe['margin']:.0%} of the free memory held back; {_seqs(int(e.max_concurrency))} at "
            f"{e.max_model_len:,} tokens"
        )
    if not safe["max_concurrency"] and not safe["max_model_len_at_concurrency"]:
        return head + "none: it does not fit even one sequence"
    if e.engine == "llama.cpp":
        # llama.cpp splits --ctx-size into --parallel slots: the safe point's length is the slot's (the policy
        # resolves it; capacity/model.py safe_operating_point), as in the max-concurrency line above.
        return head + (
            f"{safe['max_concurrency']} of {e.max_concurrency:.0f} slots at {safe['max_model_len']:,} "
            "tokens each (--ctx-size / --parallel)"
        )
    at_len = (
        f"{_seqs(safe['max_concurrency'])} at {safe['max_model_len']:,} tokens"
        if safe["max_concurrency"]
        else f"not one sequence at {safe['max_model_len']:,} tokens"
    )
    if _serial(e) and safe["concurrency"] > 1:
        return head + at_len + f"; {_seqs(safe['concurrency'])} at once: not served (one request at a time)"
    return (
        head
        + at_len
        + (f"; {_seqs(safe['concurrency'])} up to {safe['max_model_len_at_concurrency']:,} tokens")
    )


def _kv_band(e: Estimate) -> list[str]:
    """The KV band, the term that makes most of its width, every term it was widened for because it is unknown
    here, and what moves the pool outside the band (capacity/band_terms.py)."""
    band = e.extra.get("kv_band_bytes")
    widest = e.extra.get("kv_band_widest")
    unknown = list(e.extra.get("kv_unknown_terms") or ())
    lines = []
    if band and widest and band[0] != band[1]:
        lines.append(
            f"KV band: {gib(max(0, band[0]))}-{gib(max(0, band[1]))} GiB; most of its width comes from the "
            f"{widest} term" + (" (an unknown term: see its note)" if widest in unknown else "")
        )
        others = [t for t in unknown if t != widest]
        if others:
            lines.append("  also widened for unknown terms: " + ", ".join(others) + " (see their notes)")
    lines += [f"  not in the band: {t}" for t in e.extra.get("kv_unbanded_terms") or ()]
    return lines


def _verdict(v: Verdict) -> list[str]:
    """The one verdict (capacity/verdict.py): its headline, then why, what it costs and what changes it."""
    lines = [f"verdict: {v.headline}"]
    lines += [f"  why: {r}" for r in v.why]
    lines += [f"  cost: {c}" for c in v.costs]
    label = {
        DOES_NOT_FIT: "try",
        AT_ESTIMATE: "safe with",
        PARTIAL_OFFLOAD: "all on the GPU with",
    }.get(v.kind, "try")
    lines += [f"  {label}: {t}" for t in v.changes]
    return lines


def _draft_and_host_tier(e: Estimate) -> list[str]:
    """Speculative decoding's draft (capacity/speculative.py) and a host KV tier (capacity/offload.py)."""
    extra = e.extra
    out: list[str] = []
    spec = extra.get("speculative")
    if spec:
        where = "inside the KV pool" if spec["draft_kv_in_pool"] else "its own pool"
        out.append(
            f"speculative decoding ({spec['method']}"
            + (f", draft {spec['draft']}" if spec["draft"] else "")
            + f"): draft weights {gib(spec['draft_weights_bytes'])} GiB, draft KV {gib(spec['draft_kv_bytes'])} GiB "
            f"({where}, {spec['draft_kv_bytes_per_token']:,} B per token)"
            + (
                f"; {spec['extra_slots']:,} extra slots: {spec['extra_slots_meaning']}"
                if spec["extra_slots"]
                else ""
            )
        )
    main = (extra.get("devices") or [{}])[0]
    if main.get("draft_buffers_bytes"):
        out.append(
            f"  {main['device']}'s total and headroom include the draft's {gib(main['draft_buffers_bytes'])} GiB"
        )
    tier = extra.get("kv_offload")
    if tier:
        host = tier["host_bytes_per_gpu"]
        out.append(
            f"KV offload ({tier['connector']}): "
            + (
                f"{gib(host)} GiB of host memory per GPU ({gib(tier['host_bytes_total'])} GiB in all), "
                f"{tier['host_tokens']:,} tokens; GPU pool change {gib(tier['gpu_pool_change_bytes'])} GiB"
                if host is not None
                else "host memory sized outside the engine"
            )
        )
    return out


def _placement(e: Estimate) -> list[str]:
    """llama.cpp: every card's buffers and the host's share, as its load_tensors / KV / compute lines print them."""
    extra = e.extra
    devices, host = extra.get("devices"), extra.get("host")
    if not devices or not host:
        return []
    rows = [
        [
            d["device"],
            d["gpu"],
            str(d["layers"]) + ("+out" if d["output_layer"] else ""),
            gib(d["model_buffer_bytes"]),
            gib(d["kv_buffer_bytes"]),
            gib(d["compute_buffer_bytes"]),
            gib(d["total_bytes"]),
            gib(d["headroom_bytes"]),
        ]
        for d in devices
    ]
    mapped = (
        f" ({gib(host['mapped_buffer_bytes'])} GiB CPU_Mapped span)"
        if host["mapped"]
        else " (CPU, not mapped)"
    )
    rows.append(
        [
            "host",
            "RAM",
            str(host["layers"]) + ("+out" if host["output_layer"] else ""),
            gib(host["model_buffer_bytes"]),
            gib(host["kv_buffer_bytes"]),
            gib(host["compute_buffer_bytes"]),
            gib(host["model_buffer_bytes"] + host["kv_buffer_bytes"] + host["compute_buffer_bytes"]),
            "",
        ]
    )
    out = ["", "placement (GiB; llama.cpp's model / KV / compute buffers per device):"]
    out += _table(
        ["device", "card", "layers", "model", "KV", "compute", "total", "headroom"], rows, {2, 3, 4, 5, 6, 7}
    )
    out.append(f"host model buffer{mapped}: tensors kept in host memory; headroom after the CUDA context")
    return out


SWEEP_WORDS = {
    FITS: "fits",
    AT_ESTIMATE: "at risk",
    PARTIAL_OFFLOAD: "part on CPU",
    DOES_NOT_FIT: "no",
}


def render_sweep(result: SweepResult, model_name: str, gpu: GPU) -> str:
    names = [n for n, _ in result.axes]
    header = names + ["KV GiB", "KV tokens", "max conc", "headroom GiB", "verdict"]
    rows = []
    for r in result.rows:
        if "kv_cache_bytes" in r:
            rows.append(
                [str(r[n]) for n in names]
                + [
                    gib(r["kv_cache_bytes"]),
                    f"{r['kv_cache_tokens']:,}",
                    f"{r['max_concurrency']:.2f}",
                    gib(r["headroom_bytes"]),
                    SWEEP_WORDS[r["verdict"]],
                ]
            )
        else:
            rows.append([str(r[n]) for n in names] + ["-", "-", "-", "-", "no: " + str(r.get("error"))[:60]])
    if any(
        "rules_changed" in r for r in result.rows
    ):  # --sweep engine-version: what changed from the release before
        header.append("release rules vs the release before")
        rows = [
            row + [", ".join(r.get("rules_changed") or []) or "-"]
            for row, r in zip(rows, result.rows, strict=True)
        ]
    lines = [f"{model_name} on {gpu.name}: {len(result.rows)} configurations", ""]
    lines += _table(header, rows, set(range(len(names), len(names) + 4)))
    return "\n".join(lines)


def plot_sweep(result: SweepResult, fmt: str = "png", title: str = "") -> bytes:
    """The sweep as an image file's bytes in *fmt* (png, svg, pdf: what matplotlib writes). 1 axis:
    max concurrency per value; 2 axes: a heat map of max concurrency (blank = does not fit)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = result.axes
    value = {
        tuple(r[n] for n, _ in axes): (r.get("max_concurrency") if r.get("fits") else None)
        for r in result.rows
    }
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    if len(axes) == 1:
        ((name, xs),) = axes
        ys = [value[(x,)] or 0 for x in xs]
        ax.bar([str(x) for x in xs], ys, color=["#4c72b0" if value[(x,)] else "#c44e52" for x in xs])
        ax.set_xlabel(name)
        ax.set_ylabel("max concurrency")
    else:
        (yname, ys), (xname, xs) = axes[0], axes[1]
        grid: list[list[Any]] = [
            [value.get((y, x) + tuple(v[0] for _, v in axes[2:])) for x in xs] for y in ys
        ]
        data = [[float("nan") if c is None else c for c in row] for row in grid]
        im = ax.imshow(data, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_yticks(range(len(ys)), [str(y) for y in ys])
        ax.set_xlabel(xname)
        ax.set_ylabel(yname)
        for i, row in enumerate(grid):
            for j, c in enumerate(row):
                ax.text(
                    j,
                    i,
                    "no fit" if c is None else f"{c:.1f}",
                    ha="center",
                    va="center",
                    color="white" if c is None or c < 1 else "black",
                    fontsize=8,
                )
        fig.colorbar(im, ax=ax, label="max concurrency at max_model_len")
    ax.set_title(title or "vramlab plan sweep")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    plt.close(fig)
    return buf.getvalue()
