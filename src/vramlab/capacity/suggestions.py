"""What to change when a plan does not fit, is not safe, or leaves part of the model on the CPU: each change
checked by re-running the model (never guessed) and said in the engine's own flags."""

from __future__ import annotations

import math
from typing import Any

from vramlab.capacity.constants import Constants
from vramlab.capacity.estimate import Estimate
from vramlab.capacity.gpus import GPU
from vramlab.capacity.model import estimate, limits_at, max_len_that_fits, run_policy
from vramlab.capacity.settings import EngineSettings
from vramlab.capacity.spec import ModelSpec
from vramlab.engines import label
from vramlab.errors import ConfigError

SAFE_MARGIN = 0.10  # `vramlab plan --margin`'s default: the length a "try:" line also names as safe

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


def _say_context(engine: str, n: int) -> str:
    if engine == "vllm":
        return f"--max-model-len {n}"
    if engine == "transformers":  # no server flag: the longest request it may be sent
        return f"requests of at most {n:,} tokens"
    return f"a {n:,}-token context ({label(engine)} {_SPELLING[engine]['context']} {n})"


def _say_shorter(engine: str, n: int, what: str = "fits") -> str:
    if engine == "vllm":
        return f"lower --max-model-len to {n} (the largest that {what})"
    flag = _SPELLING[engine]["context"]
    return (
        f"lower the context to {n:,} tokens, the largest that {what} ("
        + (f"{label(engine)} {flag} {n}; " if flag else "")
        + "vramlab --max-model-len)"
    )


def _say_gpus(engine: str, tp: int) -> str:
    if engine == "vllm":
        return f"use -tp {tp} ({tp} GPUs)"
    if engine == "transformers":  # from_pretrained(tp_plan="auto") under torchrun
        return f'use {tp} GPUs (tp_plan="auto" under torchrun --nproc-per-node {tp})'
    return f"use {tp} GPUs ({label(engine)} {_SPELLING[engine]['tp']} {tp})"


def _candidates(model: ModelSpec, s: EngineSettings, est: Estimate) -> list[tuple[str, dict[str, object]]]:
    """One-knob changes worth checking, each with its wording in the engine's flags."""
    engine, spell = s.engine, _SPELLING[s.engine]
    out: list[tuple[str, dict[str, object]]] = []
    if s.kv_cache_dtype in ("auto", "bfloat16", "float16") and spell["kv"]:
        out.append(
            (
                f"use {spell['kv']} (halves KV bytes per token)"
                if engine == "vllm"
                else f"use an FP8 KV cache ({label(engine)} {spell['kv']}; halves KV bytes per token)",
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
        safe = max_len_that_fits(model, gpu, s, constants, 1.0, "pessimistic", SAFE_MARGIN)
        out.append(
            _say_shorter(s.engine, longest)
            + (f"; {safe:,} holds with the {SAFE_MARGIN:.0%} margin at the pessimistic end" if safe else "")
        )
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


def safe_suggestions(
    model: ModelSpec, gpu: GPU, s: EngineSettings, constants: Constants | None, est: Estimate, margin: float
) -> list[str]:
    """Changes after which the safe operating point holds one sequence of the planned length (every band at its
    pessimistic end, *margin* held back), each checked with that same test; at most three."""
    if s.engine == "ollama":
        return _safe_ollama(model, gpu, s, constants, margin)

    def safe(t: EngineSettings) -> bool:
        try:
            ok, conc = limits_at(model, gpu, t, constants, "pessimistic", margin)
        except ConfigError:
            return False
        return ok and conc >= 1

    out: list[str] = []
    if s.engine == "llama.cpp":
        per_slot = s.with_(ctx_size=None)
        longest = max_len_that_fits(model, gpu, per_slot, constants, 1.0, "pessimistic", margin)
        if 0 < longest < est.max_model_len:
            flags = run_policy(model, gpu, per_slot.with_(max_model_len=longest), constants)[1].settings
            out.append(
                f"lower the context to {longest:,} tokens per slot, the largest that is safe (--ctx-size "
                f"{flags['ctx_size']} --parallel {flags['parallel']})"
            )
        if s.kv_cache_dtype in (None, "auto", "f16", "bf16", "float16") and safe(
            s.with_(kv_cache_dtype="q8_0", flash_attn=True)
        ):
            out.append("use a q8_0 KV cache (-ctk q8_0 -ctv q8_0 -fa on; about half the KV bytes)")
        return out[:3]
    longest = max_len_that_fits(model, gpu, s, constants, 1.0, "pessimistic", margin)
    if 0 < longest < est.max_model_len:
        out.append(_say_shorter(s.engine, longest, "is safe"))
    seqs = int(est.settings.get("max_num_seqs") or 0)
    if s.engine == "vllm" and seqs > 16 and safe(s.with_(max_num_seqs=max(16, seqs // 4))):
        out.append(
            f"lower --max-num-seqs to {max(16, seqs // 4)} (a smaller profiled sampler and fewer graphs)"
        )
    for text, change in _candidates(model, s, est):
        if len(out) >= 3:
            break
        if "tensor_parallel_size" in change and any("GPUs" in o or "-tp" in o for o in out):
            continue
        if safe(s.with_(**change)):
            out.append(text)
    return out[:3]


def _safe_ollama(
    model: ModelSpec, gpu: GPU, s: EngineSettings, constants: Constants | None, margin: float
) -> list[str]:
    """Ollama re-decides its offload from the free memory: what keeps every layer on the GPU with *margin* of it
    held back (the same re-planned changes as for a partial offload, at that free memory)."""
    from vramlab.capacity.engines.ollama import full_offload, suggest

    held = s.with_(other_processes_bytes=s.other_processes_bytes + int(margin * gpu.memory_bytes))
    est_held = estimate(model, gpu, held, constants, with_suggestions=False)
    if full_offload(est_held):
        return []
    found = suggest(model, gpu, held, constants, est_held)
    return [t for t in found if not t.startswith("no single change")]
