"""`estimate()`: one engine policy plus the bookkeeping every engine shares.

The policy says which components exist and how the engine turns them into a KV pool; this
module evaluates that at the expected point and at both ends of the bands, and decides the
verdict, the headroom and what to change when it does not fit.
"""

from __future__ import annotations

import math
from dataclasses import replace
from importlib import import_module
from typing import Any

from vramlab.capacity import defaults
from vramlab.capacity.band_terms import unbanded_terms, unknown_terms
from vramlab.capacity.constants import Constants
from vramlab.capacity.devices import held_before_start
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.engines.registry import blocks_override, policy_module
from vramlab.capacity.estimate import Component, Estimate
from vramlab.capacity.gpus import GPU
from vramlab.capacity.refusals import device_terms, memory_allowance, refusals, used_bytes
from vramlab.capacity.settings import ENGINES, EngineSettings
from vramlab.capacity.spec import ModelSpec
from vramlab.capacity.validation import check_settings
from vramlab.errors import ConfigError

_DEFAULT_CONSTANTS: Constants | None = None


def _constants(c: Constants | None) -> Constants:
    global _DEFAULT_CONSTANTS
    if c is not None:
        return c
    if _DEFAULT_CONSTANTS is None:
        _DEFAULT_CONSTANTS = Constants.defaults()
    return _DEFAULT_CONSTANTS


def run_policy(
    model: ModelSpec, gpu: GPU, settings: EngineSettings, constants: Constants | None = None
) -> tuple[Context, PolicyResult]:
    engine = settings.engine
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    check_settings(settings)
    from vramlab.capacity import offload, speculative

    # a draft changes some engine defaults first; the draft and a host KV tier go on top of the policy's result
    ctx = Context(model, gpu, speculative.prepare(settings), _constants(constants))
    result: PolicyResult = import_module(policy_module(engine, gpu.is_host)).plan(ctx)
    if engine == "vllm" and not gpu.is_host and settings.num_gpu_blocks_override is not None:
        result = blocks_override(result, settings.num_gpu_blocks_override)
    return ctx, offload.apply(ctx, speculative.apply(ctx, result))


def estimate(
    model: ModelSpec,
    gpu: GPU,
    settings: EngineSettings,
    constants: Constants | None = None,
    with_suggestions: bool = True,
) -> Estimate:
    """Predict one GPU's memory for *model* served by *settings.engine* on *gpu*.

    When it does not fit, `suggestions` lists changes that do (each checked by re-running the
    model); sweeps turn that off for speed.
    """
    ctx, r = run_policy(model, gpu, settings, constants)
    comps = r.components
    kv_mid = r.kv_rule(comps, "mid")
    kv_low, kv_high, widest = (kv_mid, kv_mid, None) if r.kv_fixed else kv_band(r, comps, kv_mid)
    kv_comp = _kv_component(r, kv_mid, kv_low, kv_high)
    lim = r.limits(max(0, kv_mid))
    pess = r.limits(max(0, kv_low))
    opt = r.limits(max(0, kv_high))
    all_comps = tuple(comps) + (kv_comp,)
    used = sum(c.bytes for c in all_comps) if r.kv_fixed else used_bytes(comps, kv_comp, r)
    headroom = memory_allowance(ctx) - used
    device = device_terms(ctx, r, tuple(comps), used)
    reasons = [*r.reasons, *refusals(ctx, r, kv_mid, lim.num_blocks, used, headroom), *device.reasons]
    context_note = defaults.context_note(model, settings, r.max_model_len)
    fits = not reasons
    est = Estimate(
        model=model.name,
        gpu=gpu.name,
        engine=settings.engine,
        engine_version=settings.resolved_version,
        gpu_memory_bytes=ctx.total,
        settings=r.settings,
        components=all_comps,
        kv_bytes_per_token=r.kv_bytes_per_token,
        block_size=r.block_size,
        num_blocks=lim.num_blocks,
        kv_cache_bytes=max(0, kv_mid),
        kv_available_bytes=kv_mid,
        kv_cache_tokens=lim.kv_cache_tokens,
        max_concurrency=lim.max_concurrency,
        max_model_len=r.max_model_len,
        budget_bytes=r.budget_bytes,
        used_bytes=used,
        headroom_bytes=headroom,
        fits=fits,
        reasons=tuple(reasons),
        notes=tuple(r.notes) + device.notes + ((context_note,) if context_note else ()),
        pessimistic=pess,
        optimistic=opt,
        per_sequence_state_bytes=r.per_sequence_state_bytes,
        # the KV band signed, as a failed start-up prints it (the kv_cache component stops at 0)
        extra={
            **r.extra,
            **device.extra,
            "kv_band_bytes": (min(kv_low, kv_mid), max(kv_high, kv_mid)),
            **({"kv_band_widest": widest} if widest else {}),
            **_named_terms(r, comps, settings, gpu.is_host),
            **({"default_context_rule": context_note} if context_note else {}),
        },
    )
    if with_suggestions and (not fits or _partly_on_cpu(est)):
        from vramlab.capacity.suggestions import suggest

        est = replace(est, suggestions=tuple(suggest(model, gpu, settings, constants, est)))
    return est


def _kv_component(r: PolicyResult, kv_mid: int, kv_low: int, kv_high: int) -> Component:
    """The pool as a component: its band floored at 0 (a failed start's negative figure is kept in the extra)."""
    low, high = max(0, min(kv_low, kv_mid)), max(0, kv_high, kv_mid)
    return Component("kv_cache", max(0, kv_mid), low, high, r.kv_provenance, r.kv_note, in_budget=True)


def _partly_on_cpu(est: Estimate) -> bool:
    """Ollama left layers on the CPU: its suggestions say what puts every layer on the GPU."""
    o = est.extra.get("ollama")
    return bool(o and o["layers_offload"] < o["layers_model"])


def _named_terms(
    r: PolicyResult, comps: list[Component], settings: EngineSettings, on_host: bool = False
) -> dict[str, list[str]]:
    """The terms the band was widened for because they are unknown, and those that move the pool outside any band
    (capacity/band_terms.py): the plan output names both."""
    unknown = [] if r.kv_fixed else unknown_terms(comps, r.notes)
    unbanded = (
        [] if r.kv_fixed or on_host else unbanded_terms(settings.engine, settings.other_processes_bytes)
    )
    return {
        **({"kv_unknown_terms": unknown} if unknown else {}),
        **({"kv_unbanded_terms": unbanded} if unbanded else {}),
    }


def kv_band(r: PolicyResult, comps: list[Component], kv_mid: int) -> tuple[int, int, str | None]:
    """(low, high, the component that swings the pool most). The band stacks every in-budget component at its
    worst end: added in quadrature instead (independent errors) it was a quarter narrower but held fewer than 90 %
    of the held-out measurements (docs/capacity-model.md, "Band coverage"). The widest term is the one whose own
    swing, the others held at their expected value, moves the pool's low end most."""
    held = [replace(c, low_bytes=c.bytes, high_bytes=c.bytes) for c in comps]
    swings = [
        (abs(kv_mid - r.kv_rule(held[:i] + [c] + held[i + 1 :], "high")), c.name)
        for i, c in enumerate(comps)
        if c.in_budget and c.low_bytes != c.high_bytes
    ]
    widest = max(swings)[1] if swings and max(swings)[0] > 0 else None
    return r.kv_rule(comps, "high"), r.kv_rule(comps, "low"), widest


def max_len_that_fits(
    model: ModelSpec,
    gpu: GPU,
    s: EngineSettings,
    constants: Constants | None = None,
    concurrency: float = 1.0,
    point: str = "mid",
    margin: float = 0.0,
) -> int:
    """The largest max_model_len whose pool still holds *concurrency* requests (0 if none does), up to the
    context the engine derives (capacity/defaults.py), or the one given if longer."""
    hi = defaults.context_limit(model, s)
    # llama-server's --fit would "fit" any context by moving layers to the host: the search is for the
    # context that holds with the placement as given (--fit off)
    s = s.with_(fit=False) if s.engine in ("llama.cpp", "ollama") else s

    def holds(length: int) -> bool:
        try:
            e = limits_at(model, gpu, s.with_(max_model_len=length), constants, point, margin)
        except ConfigError:
            return False
        return e[0] and e[1] >= concurrency

    if holds(hi):
        return hi
    lo = 0
    while hi - lo > 16 if hi > 4096 else hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo - lo % 16 if lo > 4096 else lo


def limits_at(
    model: ModelSpec, gpu: GPU, s: EngineSettings, constants: Constants | None, point: str, margin: float
) -> tuple[bool, float]:
    """(fits, max concurrency) with every in-budget component at *point* and *margin* of the pool held back."""
    ctx, r = run_policy(model, gpu, s, constants)
    band_point = {"mid": "mid", "pessimistic": "high", "optimistic": "low"}[point]
    kv = r.kv_rule(r.components, band_point)
    if s.engine == "ollama":
        # Ollama sizes its offload to the free memory when it loads the model (engines/ollama.py): it never refuses
        # for memory; what the margin moves is how many layers stay on the CPU (safe_operating_point says that).
        return not r.reasons, r.limits(kv).max_concurrency
    if r.kv_fixed:
        # Fixed pools (llama.cpp, transformers): the card must hold everything at this band point.
        comps = r.components
        total = (
            sum({"mid": c.bytes, "high": c.high_bytes, "low": c.low_bytes}[band_point] for c in comps) + kv
        )
        free = memory_allowance(ctx) * (1 - margin)
        return (not r.reasons and total <= free), r.limits(kv).max_concurrency
    kv = int(kv * (1 - margin))
    if kv <= 0 or r.reasons:
        return False, 0.0
    lim = r.limits(kv)
    outside = sum(
        {"mid": c.bytes, "high": c.high_bytes, "low": c.low_bytes}[band_point]
        for c in r.components
        if not c.in_budget
    )
    inside = (
        r.budget_bytes
        if s.engine == "vllm" and not s.kv_cache_memory_bytes
        else sum(c.bytes for c in r.components if c.in_budget) + kv
    )
    fits = lim.num_blocks >= r.min_blocks_needed and inside + outside <= memory_allowance(ctx)
    return fits, lim.max_concurrency


def safe_at_planned_length(
    model: ModelSpec, gpu: GPU, s: EngineSettings, constants: Constants | None = None, margin: float = 0.10
) -> dict[str, Any]:
    """How many sequences of the planned length still fit with *margin* held back and every component at the
    pessimistic end of its band; for Ollama also how many layers it would still offload with *margin* of the free
    memory held back (it sizes the offload itself, capacity/engines/ollama.py)."""
    if not 0 <= margin < 1:
        raise ConfigError(f"--margin must be in [0, 1), got {margin}")
    fits, conc = limits_at(model, gpu, s, constants, "pessimistic", margin)
    out: dict[str, Any] = {"margin": margin, "max_concurrency": math.floor(conc) if fits else 0}
    # the margin on top of what others hold already (on a unified machine the OS's share, capacity/devices.py)
    held = s.with_(other_processes_bytes=held_before_start(gpu, s) + int(margin * gpu.memory_bytes))
    if s.engine == "ollama" and "ollama" in (decided := run_policy(model, gpu, held, constants)[1].extra):
        decision: Any = decided["ollama"]  # Ollama's own estimator (its llama-server era plans as llama.cpp)
        out["offload_layers"], out["layers_model"] = decision["layers_offload"], decision["layers_model"]
    return out


def safe_operating_point(
    model: ModelSpec,
    gpu: GPU,
    s: EngineSettings,
    constants: Constants | None = None,
    margin: float = 0.10,
    concurrency: int | None = None,
) -> dict[str, Any]:
    """The largest concurrency at max_model_len, and context at a concurrency, that still fit with
    *margin* of the KV pool held back and every component at the pessimistic end of its band."""
    out = safe_at_planned_length(model, gpu, s, constants, margin)
    # the length the policy resolved (the derived default, or llama.cpp's per-slot context): the same length the
    # plan's max-concurrency line counts in
    out["max_model_len"] = run_policy(model, gpu, s, constants)[1].max_model_len or None
    want = concurrency or max(1, int(out["max_concurrency"]))
    out["concurrency"] = want
    out["max_model_len_at_concurrency"] = max_len_that_fits(
        model, gpu, s, constants, want, "pessimistic", margin
    )
    return out
