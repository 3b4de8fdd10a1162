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
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import Component, Estimate
from vramlab.capacity.gpus import GPU
from vramlab.capacity.refusals import device_terms, memory_allowance, refusals, used_bytes
from vramlab.capacity.settings import ENGINES, EngineSettings
from vramlab.capacity.spec import ModelSpec
from vramlab.capacity.validation import check_settings
from vramlab.errors import ConfigError

_POLICIES = {
    "vllm": "vramlab.capacity.engines.vllm_auto",  # vllm.py's policy, with --max-model-len auto
    "sglang": "vramlab.capacity.engines.sglang",
    "tgi": "vramlab.capacity.engines.tgi",
    "llama.cpp": "vramlab.capacity.engines.llamacpp",
    "transformers": "vramlab.capacity.engines.transformers",
    "ollama": "vramlab.capacity.engines.ollama",
}
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
    ctx = Context(model, gpu, settings, _constants(constants))
    policy = import_module(_POLICIES[engine])
    return ctx, policy.plan(ctx)


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
            **_named_terms(r, comps, settings),
            **({"default_context_rule": context_note} if context_note else {}),
        },
    )
    if not fits and with_suggestions:
        est = replace(est, suggestions=tuple(suggest(model, gpu, settings, constants, est)))
    return est


def _kv_component(r: PolicyResult, kv_mid: int, kv_low: int, kv_high: int) -> Component:
    """The pool as a component: its band floored at 0 (a failed start's negative figure is kept in the extra)."""
    low, high = max(0, min(kv_low, kv_mid)), max(0, kv_high, kv_mid)
    return Component("kv_cache", max(0, kv_mid), low, high, r.kv_provenance, r.kv_note, in_budget=True)


def _named_terms(r: PolicyResult, comps: list[Component], settings: EngineSettings) -> dict[str, list[str]]:
    """The terms the band was widened for because they are unknown, and those that move the pool outside any band
    (capacity/band_terms.py): the plan output names both."""
    unknown = [] if r.kv_fixed else unknown_terms(comps, r.notes)
    unbanded = [] if r.kv_fixed else unbanded_terms(settings.engine, settings.other_processes_bytes)
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


# How each engine spells what `suggest` changes: `vramlab plan` takes one spelling for every engine,
# the user changes the engine's own flag. From each engine's --help: vllm serve; SGLang's
# server_args.py (--context-length, --tp-size, --kv-cache-dtype auto|fp8_e5m2|fp8_e4m3); TGI's
# launcher (--max-total-tokens, --num-shard, --kv-cache-dtype fp8_e4m3fn|fp8_e5m2, --quantize);
# llama-server (--ctx-size over all --parallel slots, --cache-type-k/-v q8_0 needing -fa).
_SPELLING: dict[str, dict[str, str]] = {
    "vllm": {
        "context": "--max-model-len",
        "kv": "--kv-cache-dtype fp8",
        "tp": "-tp",
        "fp8": "--quantization fp8",
    },
    "sglang": {
        "context": "--context-length",
        "kv": "--kv-cache-dtype fp8_e5m2",
        "tp": "--tp-size",
        "fp8": "--quantization fp8",
    },
    "tgi": {
        "context": "--max-total-tokens",
        "kv": "--kv-cache-dtype fp8_e5m2",
        "tp": "--num-shard",
        "fp8": "--quantize fp8",
    },
    "transformers": {"context": "", "kv": "", "tp": "", "fp8": ""},
}
_ENGINE_NAMES = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "tgi": "TGI",
    "llama.cpp": "llama.cpp",
    "transformers": "transformers",
}


def _say_context(engine: str, n: int) -> str:
    if engine == "vllm":
        return f"--max-model-len {n}"
    if engine == "transformers":  # no server flag: the longest request it may be sent
        return f"requests of at most {n:,} tokens"
    return f"a {n:,}-token context ({_ENGINE_NAMES[engine]} {_SPELLING[engine]['context']} {n})"


def _say_shorter(engine: str, n: int) -> str:
    if engine == "vllm":
        return f"lower --max-model-len to {n} (the largest that fits)"
    flag = _SPELLING[engine]["context"]
    return (
        f"lower the context to {n:,} tokens, the largest that fits ("
        + (f"{_ENGINE_NAMES[engine]} {flag} {n}; " if flag else "")
        + "vramlab --max-model-len)"
    )


def _say_gpus(engine: str, tp: int) -> str:
    if engine == "vllm":
        return f"use -tp {tp} ({tp} GPUs)"
    if engine == "transformers":  # from_pretrained(tp_plan="auto") under torchrun
        return f'use {tp} GPUs (tp_plan="auto" under torchrun --nproc-per-node {tp})'
    return f"use {tp} GPUs ({_ENGINE_NAMES[engine]} {_SPELLING[engine]['tp']} {tp})"


def _candidates(model: ModelSpec, s: EngineSettings, est: Estimate) -> list[tuple[str, dict[str, object]]]:
    """One-knob changes worth checking, each with its wording in the engine's flags."""
    engine, spell = s.engine, _SPELLING[s.engine]
    out: list[tuple[str, dict[str, object]]] = []
    if s.kv_cache_dtype in ("auto", "bfloat16", "float16") and spell["kv"]:
        out.append(
            (
                f"use {spell['kv']} (halves KV bytes per token)"
                if engine == "vllm"
                else f"use an FP8 KV cache ({_ENGINE_NAMES[engine]} {spell['kv']}; halves KV bytes per token)",
                {"kv_cache_dtype": "fp8"},
            )
        )
    if engine == "vllm" and s.mps_memory_limit_bytes:  # the legacy MPS limit leaves util a share of the card
        outside = sum(c.bytes for c in est.components if not c.in_budget)
        util = math.floor((s.mps_memory_limit_bytes - outside) / est.gpu_memory_bytes * 100) / 100
        out.append(
            (
                f"lower --gpu-memory-utilization to {util} (under the MPS limit)",
                {"gpu_memory_utilization": util},
            )
        )
    if engine == "vllm" and (est.settings.get("gpu_memory_utilization") or 0) < 0.95:
        out.append(
            (
                "raise --gpu-memory-utilization to 0.95 (check the headroom for CUDA graphs)",
                {"gpu_memory_utilization": 0.95},
            )
        )
    limits = dict(s.limit_mm_per_prompt or ())
    if engine == "vllm" and model.vision is not None and limits.get("video", 1) > 0:
        # V1 profiles the tower with a video as long as max_model_len allows (engines/vllm_mm.py)
        out.append(
            (
                "serve no videos: --limit-mm-per-prompt '{\"video\": 0}' (the start-up then profiles the vision "
                "encoder on images, not a max_model_len-long video)",
                {"limit_mm_per_prompt": tuple(sorted({**limits, "video": 0}.items()))},
            )
        )
    for tp in (2, 4, 8):
        if tp > s.tensor_parallel_size and model.num_attention_heads % tp == 0:
            out.append((_say_gpus(engine, tp), {"tensor_parallel_size": tp}))
    if model.quant is None:
        out.append(
            (
                f"use an FP8 checkpoint or {spell['fp8']}" if spell["fp8"] else "use an FP8 checkpoint",
                {"quantization": "fp8"},
            )
        )
        out.append(("use a 4-bit AWQ/GPTQ checkpoint", {"quantization": "awq"}))
    return out


def suggest(
    model: ModelSpec, gpu: GPU, s: EngineSettings, constants: Constants | None, est: Estimate
) -> list[str]:
    """Changes that make it fit, each checked by re-running the model (not guessed), each in the
    engine's own flags."""
    if s.engine == "llama.cpp":
        return _suggest_llamacpp(model, gpu, s, constants)
    if s.engine == "ollama":
        from vramlab.capacity.engines.ollama import suggest as suggest_ollama

        return suggest_ollama(model, gpu, s, constants, est)
    out: list[str] = []

    def ok(**changes: object) -> Estimate | None:
        try:
            e = estimate(model, gpu, s.with_(**changes), constants, with_suggestions=False)
        except ConfigError:
            return None
        return e if e.fits else None

    length = est.max_model_len
    longest = max_len_that_fits(model, gpu, s, constants)
    if longest and longest < length:
        out.append(_say_shorter(s.engine, longest))
    if (
        s.engine == "vllm"
        and (s.max_num_seqs or 0) > 16
        and ok(max_num_seqs=max(16, (s.max_num_seqs or 256) // 4))
    ):
        out.append(f"lower --max-num-seqs to {max(16, (s.max_num_seqs or 256) // 4)}")
    partial: list[str] = []
    for text, change in _candidates(model, s, est):
        if "tensor_parallel_size" in change and any(
            o.startswith(("use -tp", "use 2 GPUs", "use 4 GPUs")) for o in out + partial
        ):
            continue  # the smallest TP that helps is enough
        if ok(**change):
            out.append(text)
        elif len(partial) < 2:
            # Not enough alone: how long a context would it allow?
            try:
                longer = max_len_that_fits(model, gpu, s.with_(**change), constants)
            except ConfigError:
                longer = 0
            if longer >= min(1024, length):
                partial.append(f"{text} with {_say_context(s.engine, longer)}")
    if len(out) < 3:
        out.extend(partial[: 3 - len(out)])
    if not out:
        out.append("no single change fits on this card: use a larger GPU or more GPUs")
    return out


def _suggest_llamacpp(
    model: ModelSpec, gpu: GPU, s: EngineSettings, constants: Constants | None
) -> list[str]:
    """llama.cpp sizes its KV from --ctx-size (over all --parallel slots): the context and the cache
    type are the knobs, each checked by re-running the model."""
    out: list[str] = []
    per_slot = s.with_(ctx_size=None)  # max_model_len is then each slot's context

    def ctx_flags(t: Any) -> str:
        e = estimate(model, gpu, t, constants, with_suggestions=False)
        return f"--ctx-size {e.settings.get('ctx_size')} --parallel {e.settings.get('parallel')}"

    longest = max_len_that_fits(model, gpu, per_slot, constants)
    if longest:
        out.append(
            f"lower the context to {longest:,} tokens per slot ({ctx_flags(per_slot.with_(max_model_len=longest))})"
        )
    if s.kv_cache_dtype in (None, "auto", "f16", "bf16", "float16"):
        q8 = per_slot.with_(kv_cache_dtype="q8_0", flash_attn=True)
        try:
            now = estimate(
                model, gpu, s.with_(kv_cache_dtype="q8_0", flash_attn=True), constants, with_suggestions=False
            )
            longer = 0 if now.fits else max_len_that_fits(model, gpu, q8, constants)
        except ConfigError:
            now, longer = None, 0
        text = "use a q8_0 KV cache (-ctk q8_0 -ctv q8_0 -fa on; about half the KV bytes)"
        if now is not None and now.fits:
            out.append(text)
        elif longer and longer > (longest or 0):
            out.append(
                f"{text} with {longer:,} tokens per slot ({ctx_flags(q8.with_(max_model_len=longer))})"
            )
    from vramlab.capacity.engines.llamacpp_fit import placement_suggestions

    out.extend(placement_suggestions(model, gpu, s, constants))
    if not out:
        out.append(
            "no single change fits on this card: use a larger GPU, a smaller quantization or offload "
            "fewer layers (-ngl)"
        )
    return out


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


def safe_operating_point(
    model: ModelSpec,
    gpu: GPU,
    s: EngineSettings,
    constants: Constants | None = None,
    margin: float = 0.10,
    concurrency: int | None = None,
) -> dict[str, object]:
    """The largest concurrency at max_model_len, and context at a concurrency, that still fit with
    *margin* of the KV pool held back and every component at the pessimistic end of its band."""
    if not 0 <= margin < 1:
        raise ConfigError(f"--margin must be in [0, 1), got {margin}")
    fits, conc = limits_at(model, gpu, s, constants, "pessimistic", margin)
    out: dict[str, object] = {
        "margin": margin,
        "max_concurrency": math.floor(conc) if fits else 0,
        # the length the policy resolved (the derived default, or llama.cpp's per-slot context): the same
        # length the plan's max-concurrency line counts in
        "max_model_len": run_policy(model, gpu, s, constants)[1].max_model_len or None,
    }
    want = concurrency or max(1, math.floor(conc) if fits else 1)
    out["concurrency"] = want
    out["max_model_len_at_concurrency"] = max_len_that_fits(
        model, gpu, s, constants, want, "pessimistic", margin
    )
    return out
