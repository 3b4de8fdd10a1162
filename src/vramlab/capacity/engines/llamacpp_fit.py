"""What fits under llama.cpp when everything on the GPUs does not.

- llama-server's own `--fit` (engines/llamacpp_params_fit.py has the rule): the problem built from the
  plan's settings, each dry run measured by engines/llamacpp.py `layout`, and the settings it chooses;
- the suggestions: the largest `-ngl`, the fewest MoE experts kept on the host (`--n-cpu-moe`), each
  found by re-planning (the same `estimate` a user's `vramlab plan` runs), never guessed."""

from __future__ import annotations

import re
from typing import Any

from vramlab.capacity.engines.llamacpp_params_fit import (
    DEFAULT_FIT_CTX,
    DEFAULT_TARGET_MIB,
    FIT_FROM,
    HOST,
    STREAMS_FROM,
    UINT32,
    Outcome,
    Problem,
    Projection,
    Trial,
    active,
    fit,
)
from vramlab.capacity.search import largest, smallest
from vramlab.units import MIB


def placement_suggestions(model: Any, gpu: Any, s: Any, constants: Any) -> list[str]:
    """`-ngl N` (the last N layers on the GPUs) and `--n-cpu-moe N`, each the best value that fits."""
    from vramlab.capacity.model import estimate
    from vramlab.errors import ConfigError

    def fits(**changes: object) -> bool:
        try:
            return estimate(model, gpu, s.with_(**changes), constants, with_suggestions=False).fits
        except ConfigError:
            return False

    n = model.num_layers
    out: list[str] = []
    if model.is_moe and s.n_cpu_moe < n:
        moe = smallest(s.n_cpu_moe + 1, n, lambda k: fits(n_cpu_moe=k))
        if moe is not None:
            out.append(
                f"keep the MoE experts of the first {moe} layers in host memory (--n-cpu-moe {moe}; "
                "every other tensor stays on the GPU)"
            )
    now = n + 1 if s.n_gpu_layers is None or s.n_gpu_layers < 0 else min(s.n_gpu_layers, n + 1)
    if now > 0:
        ngl = largest(0, now - 1, lambda k: fits(n_gpu_layers=k))
        if ngl:
            out.append(
                f"offload {ngl} of {n + 1} layers (-ngl {ngl}); the first {n + 1 - ngl} run on the CPU, "
                "slower per token"
            )
    return out


EXPLICIT_ZERO_CTX_FROM = (7840,)  # PR #19070 (2026-01-24): `-c 0` keeps the trained context; build not pinned


def apply(ctx: Any) -> tuple[Any, dict[str, Any] | None, list[str]]:
    """The context with the settings --fit chooses, what it did (the plan's JSON `fit`) and notes."""
    from vramlab.capacity.engines import llamacpp

    s, m = ctx.settings, ctx.model
    if not active(ctx):
        if s.fit and s.llamacpp_server == "llama-server":
            return (
                ctx,
                None,
                [f"--fit is not in llama.cpp {s.resolved_version} (from b{FIT_FROM[0]}): ignored"],
            )
        return ctx, None, []
    server = llamacpp.resolve_server(ctx)
    cards = llamacpp.device_list(ctx)
    used_idx = [s.main_gpu] if s.split_mode == "none" else list(range(len(cards)))
    context = int(ctx.constants["cuda_context_bytes"])
    targets = list(s.fit_target_mib) or [DEFAULT_TARGET_MIB]
    margins = [
        (targets[i] if i < len(targets) else targets[-1] if len(targets) == 1 else 0) * MIB for i in used_idx
    ]
    given = s.ctx_size if s.ctx_size else (server.n_ctx if s.max_model_len else None)
    zero_kept = s.ctx_size == 0 and (not ctx.version or ctx.version >= EXPLICIT_ZERO_CTX_FROM)
    streams = server.slots if not server.unified and (not ctx.version or ctx.version >= STREAMS_FROM) else 1
    problem = Problem(
        free=[max(0, cards[i][1] - ctx.other - context) for i in used_idx],
        margins=margins,
        n_layer=m.num_layers,
        n_ctx_train=ctx.model_max_len,
        n_expert=m.num_experts if m.is_moe else 0,
        n_ctx=given,
        n_ctx_min=UINT32 - 1 if zero_kept else (s.fit_ctx or DEFAULT_FIT_CTX),
        n_streams=streams,
        ngl_user=None if s.n_gpu_layers is None else (-2 if s.n_gpu_layers < 0 else s.n_gpu_layers),
        user_split=s.tensor_split is not None,
        user_overrides=bool(s.override_tensor) or s.n_cpu_moe > 0,
        row_split=s.split_mode == "row",
    )
    scratch = int(ctx.constants["llamacpp_compute_scratch_bytes"])

    def measure(t: Trial) -> Projection:
        trial = _settings(s, t, len(cards))
        c = type(ctx)(ctx.model, ctx.gpu, trial, ctx.constants)
        srv = llamacpp.resolve_server(c)
        lay = llamacpp.layout(c, srv, llamacpp.kv_cells(c, srv))
        shares = [lay.devices[i] for i in used_idx]
        used = [d.total_bytes + (scratch if d.compute_bytes else 0) for d in shares]
        return Projection(used, [d.model_bytes for d in shares])

    out = fit(problem, measure)
    changes = _changes(problem, out, used_idx)
    fitted = type(ctx)(ctx.model, ctx.gpu, s.with_(**changes), ctx.constants) if changes else ctx
    return fitted, _report(out, changes), _notes(problem, out, changes)


def _settings(s: Any, t: Trial, n_cards: int) -> Any:
    changes: dict[str, object] = {"ctx_size": t.n_ctx, "max_model_len": None}
    if t.n_gpu_layers is not None:
        changes["n_gpu_layers"] = t.n_gpu_layers
    if t.tensor_split is not None:
        changes["tensor_split"] = tuple(float(x) for x in t.tensor_split)
    if t.overrides:
        changes["override_tensor"] = tuple(f"{p}={_buft(d)}" for p, d in t.overrides)
        changes["n_cpu_moe"] = 0
    return s.with_(**changes)


def _layer_of(pattern: str) -> int:
    found = re.match(r"blk\\\.(\d+)", pattern)
    return int(found.group(1)) if found else -1


def _buft(device: int) -> str:
    return "CPU" if device == HOST else f"CUDA{device}"


def _changes(p: Problem, out: Outcome, used_idx: list[int]) -> dict[str, object]:
    changes: dict[str, object] = {}
    if p.n_ctx is None:
        changes["ctx_size"] = out.n_ctx
    if out.status == "fitted" and out.n_gpu_layers is not None:
        changes["n_gpu_layers"] = out.n_gpu_layers
        if out.tensor_split is not None:
            changes["tensor_split"] = tuple(float(x) for x in out.tensor_split)
        changes["override_tensor"] = tuple(f"{pat}={_buft(d)}" for pat, d in out.overrides)
    return changes


def _report(out: Outcome, changes: dict[str, object]) -> dict[str, Any]:
    return {
        "status": out.status,
        "message": out.message,
        "ctx_size": out.n_ctx,
        "n_gpu_layers": out.n_gpu_layers,
        "tensor_split": list(out.tensor_split) if out.tensor_split else None,
        "override_tensor": [f"{pat}={_buft(d)}" for pat, d in out.overrides],
        "devices": [
            {"layers": n, "overflowing": part, "projected_bytes": used} for n, part, used in out.per_device
        ],
        "steps": list(out.steps),
        "changed": sorted(changes),
    }


def _notes(p: Problem, out: Outcome, changes: dict[str, object]) -> list[str]:
    margin = "/".join(str(m // MIB) for m in dict.fromkeys(p.margins))
    if out.status == "unchanged":
        return []
    if out.status == "failed":
        cut = f"; it had cut the context to {out.n_ctx}" if p.n_ctx is None else ""
        return [f"llama-server --fit could not keep {margin} MiB free per device: {out.message}{cut}"]
    notes = []
    if p.n_ctx is None and out.n_ctx < p.n_ctx_train * p.n_streams:
        notes.append(
            f"llama-server --fit cut the context from {p.n_ctx_train * p.n_streams} to {out.n_ctx} to keep "
            f"{margin} MiB free per device (--fit off or -c keep it)"
        )
    if out.n_gpu_layers is not None:
        total = p.n_layer + 1
        # the pattern of the output "layer" (index n_layer) matches no tensor: count real layers only
        experts = sum(1 for pat, d in out.overrides if d == HOST and _layer_of(pat) < p.n_layer)
        flags = f"-ngl {out.n_gpu_layers}"
        if out.tensor_split:
            flags += " -ts " + ",".join(str(x) for x in out.tensor_split)
        if out.overrides:
            flags += f" -ot <{len(out.overrides)} patterns>"
        where = f"{out.n_gpu_layers} of {total} layers on the GPUs" + (
            f", the routed experts (or FFN part) of {experts} layers in host memory" if experts else ""
        )
        notes.append(
            f"llama-server --fit moves weights to keep {margin} MiB free per device: {where} ({flags}); "
            "those run on the CPU, slower per token"
        )
    return notes
