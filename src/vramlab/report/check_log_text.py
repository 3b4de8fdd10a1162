"""Terminal rendering of `vramlab check-log`: what the engine decided, beside the prediction,
per rank and start-up; and one table per engine era for a folder of logs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from vramlab.report.check_log_view import (
    CheckView,
    ComparisonView,
    FolderView,
    ItemView,
    ObservationView,
    RowView,
)
from vramlab.units import gib


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _fmt(field: str, value: float | None) -> str:
    if value is None:
        return "-"
    if field.endswith("_bytes"):
        return gib(value, unit=True)
    if field == "max_concurrency":
        return f"{value:.2f}x"
    return f"{int(value):,}"


def _diff(field: str, row: RowView) -> str:
    d, rel = row.difference, row.relative
    if d is None:
        return ""
    text = (
        gib(d, sign=True, unit=True)
        if field.endswith("_bytes")
        else (f"{d:+.2f}x" if field == "max_concurrency" else f"{int(d):+,}")
    )
    return text + (f" ({rel:+.1%})" if rel is not None else "")


# What the engine decided, in the order a reader follows the budget.
SHOWN = (
    "weights_bytes",
    "non_torch_bytes",
    "activation_peak_bytes",
    "cuda_graph_bytes",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "gpu_blocks",
    "max_concurrency",
    "max_model_len",
)


def render(report: CheckView) -> str:
    out = [f"{report.source}: {report.engine} log, {report.lines} lines"]
    out.extend(f"  note: {n}" for n in report.notes)
    startups = len({it.observation.startup for it in report.items})
    for item, ranks in _distinct_items(report.items):
        out.append("")
        out.extend(_item_lines(item, ranks, startups))
    out.extend(_failure_lines(report))
    if report.summary:
        out.append("")
        out.extend(report.summary)
    return "\n".join(out)


def render_file(reports: Sequence[CheckView], skipped: Sequence[tuple[str, str]]) -> str:
    """One file that holds several logs (writers, servers, engines): each in full, then what was
    not read and why."""
    source = reports[0].source.split(" [", 1)[0] if reports else ""
    out = [f"{source}: {len(reports)} logs in one file: {', '.join(_which(r) for r in reports)}"]
    for rep in reports:
        out.append("")
        out.append(render(rep))
    if skipped:
        out.append("")
        out.append("not read:")
        out.extend(f"  {s}: {r[:300]}" for s, r in skipped)
    return "\n".join(out)


def _which(report: CheckView) -> str:
    source, engine = str(report.source), str(report.engine)
    inside = source.split(" [", 1)[1][:-1] if " [" in source else ""
    return engine + (f" [{inside}]" if inside and inside != engine else "")


def _distinct_items(items: Sequence[ItemView]) -> list[tuple[ItemView, list[int]]]:
    """TP ranks that printed the same figures, shown once with every rank named."""
    shown: dict[str, list[int]] = {}
    out = []
    for item in items:
        key = json.dumps([item.observation.measured(), item.error, item.observation.startup], sort_keys=True)
        if key in shown and item.observation.rank is not None:
            shown[key].append(item.observation.rank)
            continue
        shown[key] = [item.observation.rank] if item.observation.rank is not None else []
        out.append((item, shown[key]))
    return out


def _item_lines(item: ItemView, ranks: list[int], startups: int) -> list[str]:
    obs = item.observation
    rank = (
        f" rank {ranks[0]}"
        if len(ranks) == 1
        else f" ranks {', '.join(map(str, ranks))} (same figures)"
        if ranks
        else ""
    )
    lines = [s.line for s in obs.source_lines]
    where = f" (lines {min(lines)}-{max(lines)})" if lines else ""
    which = f"start-up {obs.startup + 1}: " if startups > 1 and obs.startup is not None else ""
    out = [
        f"{which}{obs.engine} {obs.engine_version or '(version not printed)'}  "
        f"{obs.model or '(model not printed)'}{rank}{where}",
        f"  era: {item.era_or_inferred().sentence()}",
    ]
    if obs.engine == "transformers":  # from_pretrained, then a cache per request: no pool to size
        out.append(
            "  transformers serve sizes no KV cache at start-up (each request grows its own) and prints "
            "no memory figure; read here: " + _transformers_facts(obs)
        )
    elif not obs.complete:
        out.append("  incomplete start-up: the log ends before the engine sized its KV cache")
    if obs.basis == "engine-estimate":
        out.append("  these figures are the engine's own estimate, not measured allocations")
    if item.comparison is None:
        out.append(f"  no prediction: {item.error}")
        printed = [f for f in SHOWN if getattr(obs, f) is not None]
        if printed:
            out.append(f"  {'component':18} {'engine':>12}")
        out.extend(f"  {f.removesuffix('_bytes'):18} {_fmt(f, getattr(obs, f)):>12}" for f in printed)
        return out
    return out + _prediction_lines(item, item.comparison)


def _prediction_lines(item: ItemView, cmp: ComparisonView) -> list[str]:
    est = cmp.estimate
    out = [
        f"  predicted for {est.model} on {cmp.gpu_reason}; settings: "
        + ", ".join(f"{k}={_setting(k, v)}" for k, v in sorted(item.settings_used.items())),
        *(f"  note: {n}" for n in getattr(item, "notes", ())),
        f"  {'component':18} {'engine':>12} {'vramlab':>12}  difference",
    ]
    for row in cmp.rows:
        if row.observed is None and row.predicted is None:
            continue
        out.append(
            f"  {row.field.removesuffix('_bytes'):18} {_fmt(row.field, row.observed):>12} "
            f"{_fmt(row.field, row.predicted):>12}  {_diff(row.field, row)}"
        )
    out.extend(f"  {line}" for line in getattr(item, "refusal", ()))
    line = _encoder_line(item.observation.extra, est.extra.get("encoder_profile"))
    if line:
        out.append(line)
    if cmp.explains == "unexplained":
        unseen = [
            r.field.removesuffix("_bytes")
            for r in cmp.rows
            if r.observed is None and r.predicted is not None and r.field.endswith("_bytes")
        ]
        out.append(
            "  most of the KV difference is not explained by the components the log prints"
            + (f" (not printed: {', '.join(unseen)}; nor the budget)" if unseen else " (check the budget)")
        )
    elif cmp.explains:
        moved = cmp.contributions[cmp.explains]
        out.append(
            f"  most of the KV difference comes from {cmp.explains}: it moves the predicted KV cache by "
            f"{gib(moved, sign=True, unit=True)}"
        )
    return out


def _setting(key: str, value: object) -> str:
    """A setting as its flag would say it: llama.cpp's devices by name, a split as proportions."""
    if key == "devices" and isinstance(value, tuple):
        return ",".join(str(name) for name, _ in value)
    if key == "tensor_split" and isinstance(value, tuple):
        return ":".join(f"{v:g}" for v in value)
    if key == "override_tensor" and isinstance(value, tuple):
        return " ".join(repr(v) for v in value)
    return str(value)


def _failure_lines(report: CheckView) -> list[str]:
    if not report.failures:
        return []
    out = ["", "failures:"]
    phases = report.phases or [""] * len(report.failures)
    for sig, phase in list(zip(report.failures, phases, strict=False))[:10]:
        when = f" during {phase}" if phase else ""
        out.append(f"  line {sig.line_number}: {sig.kind} ({sig.name}){when}: {sig.line.strip()[:160]}")
    if len(report.failures) > 10:
        out.append(f"  ... and {len(report.failures) - 10} more (see --json)")
    return out


def _encoder_line(seen: Mapping[str, object], planned: Mapping[str, object] | None) -> str | None:
    """vLLM V1's "Encoder cache will be initialized with a budget of N tokens, and profiled with K video
    items" beside what the plan profiles (capacity/engines/vllm_mm.py)."""
    if seen.get("encoder_budget_tokens") is None:
        return None
    log = f"{seen['encoder_budget_tokens']:,} tokens, {seen.get('encoder_items')} {seen.get('encoder_modality')} item(s)"
    if not planned:
        return f"  vision encoder profile: the log {log}; the plan does not model this tower"
    plan = f"{planned['budget_tokens']:,} tokens, {planned['items']} {planned['modality']} item(s)"
    same = (planned["budget_tokens"], planned["items"], planned["modality"]) == (
        seen["encoder_budget_tokens"],
        seen.get("encoder_items"),
        seen.get("encoder_modality"),
    )
    return f"  vision encoder profile: the log {log}; the plan {plan}" + ("" if same else " (differs)")


def render_folder(folder: FolderView) -> str:
    """One table per engine era: a row per observation, the engine's figures and the KV error."""
    out = [f"{len(folder.reports)} logs read, {len(folder.skipped)} skipped"]
    cols = (
        "weights_bytes",
        "non_torch_bytes",
        "activation_peak_bytes",
        "cuda_graph_bytes",
        "kv_cache_bytes",
        "kv_cache_tokens",
        "max_concurrency",
    )
    heads = ("weights", "non-torch", "act. peak", "graphs", "KV", "KV tokens", "conc.")
    for (_engine, label), rows in folder.groups().items():
        out.append("")
        out.append(f"{label}  ({len(rows)} observation{'s' if len(rows) != 1 else ''})")
        out.append(f"  {'log':34} {'rank':>4} " + " ".join(f"{h:>10}" for h in heads) + "  KV vs vramlab")
        for rep, it in rows:
            obs = it.observation
            kv = (
                next((r for r in it.comparison.rows if r.field == "kv_cache_bytes"), None)
                if it.comparison
                else None
            )
            verdict = (
                f"{kv.relative:+.1%}"
                if kv is not None and kv.relative is not None
                else "no prediction"
                if it.comparison is None
                else "-"
            )
            cells = " ".join(f"{_short(c, getattr(obs, c)):>10}" for c in cols)
            out.append(
                f"  {_basename(rep.source)[:34]:34} {'' if obs.rank is None else obs.rank:>4} {cells}  {verdict}"
            )
        reasons = sorted({it.error for _, it in rows if it.error})
        for why in reasons[:3]:
            out.append(f"  no prediction: {why}")
    failed = [
        (rep, sig, phase)
        for rep in folder.reports
        for sig, phase in zip(rep.failures, rep.phases or [""] * len(rep.failures), strict=False)
    ]
    if failed:
        out.append("")
        out.append("failures:")
        out.extend(
            f"  {_basename(rep.source)}: line {sig.line_number}: {sig.kind} ({sig.name})"
            + (f" during {phase}" if phase else "")
            for rep, sig, phase in failed[:30]
        )
        if len(failed) > 30:
            out.append(f"  ... and {len(failed) - 30} more (see --json)")
    if folder.skipped:
        out.append("")
        out.append("skipped:")
        out.extend(f"  {s}: {r[:140]}" for s, r in folder.skipped[:20])
    return "\n".join(out)


def _short(field: str, value: float | None) -> str:
    if value is None:
        return "-"
    if field.endswith("_bytes"):
        return gib(value) + "G"
    if field == "max_concurrency":
        return f"{value:.2f}x"
    return f"{int(value):,}"


def _transformers_facts(obs: ObservationView) -> str:
    """The memory-relevant facts a transformers start-up printed, in one clause."""
    x, parts = obs.extra, []
    if obs.settings.get("dtype"):
        parts.append(f"dtype {obs.settings['dtype']}")
    if x.get("architecture"):
        parts.append(str(x["architecture"]))
    shape = [
        f"{x[k]} {label}"
        for k, label in (
            ("num_hidden_layers", "layers"),
            ("hidden_size", "hidden"),
            ("num_key_value_heads", "KV heads"),
            ("head_dim", "head dim"),
        )
        if x.get(k) is not None
    ]
    parts.extend(shape)
    if x.get("max_position_embeddings"):
        parts.append(f"max positions {x['max_position_embeddings']:,}")
    if "continuous_batching" in x:
        parts.append("continuous batching " + ("on" if x["continuous_batching"] else "off"))
    return ", ".join(parts) or "the model only"
