"""When a plan does not fit, the reasons and the changes that fit are said in the engine's own terms,
and every change named fits when applied (it is checked by re-running the model, here again)."""

from __future__ import annotations

import re

from capacity_models import LLAMA_31_8B, QWEN3_8B, spec
from vramlab.capacity import EngineSettings, estimate, get_gpu

L4, T4, RTX4090 = (get_gpu(n) for n in ("l4", "t4", "rtx-4090"))


def _number(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    assert m, (pattern, text)
    return int(m.group(1))


def test_tgi_is_told_in_tgi_flags_and_each_change_fits():
    m, s = spec(LLAMA_31_8B), EngineSettings(engine="tgi", max_model_len=131072)
    est = estimate(m, L4, s)
    assert not est.fits
    assert not any("max seq len" in r for r in est.reasons)  # vLLM's refusal is not TGI's
    assert any("one request of 131072 tokens needs" in r for r in est.reasons), est.reasons
    shorter = next(t for t in est.suggestions if t.startswith("lower the context"))
    n = _number(r"--max-total-tokens (\d+)", shorter)
    assert estimate(m, L4, s.with_(max_model_len=n)).fits
    assert not estimate(m, L4, s.with_(max_model_len=n + 64)).fits
    shard = next(t for t in est.suggestions if "--num-shard" in t)
    tp = _number(r"--num-shard (\d+)", shard)
    if "--max-total-tokens" in shard:
        assert estimate(
            m, L4, s.with_(tensor_parallel_size=tp, max_model_len=_number(r"--max-total-tokens (\d+)", shard))
        ).fits
    else:
        assert estimate(m, L4, s.with_(tensor_parallel_size=tp)).fits
    assert not any("--max-model-len " in t and "vramlab --max-model-len" not in t for t in est.suggestions)
    assert all(" -tp " not in t for t in est.suggestions)


def test_sglang_spells_context_and_tensor_parallel_its_way():
    m, s = spec(LLAMA_31_8B), EngineSettings(engine="sglang", max_model_len=131072)
    est = estimate(m, T4, s)
    assert not est.fits and est.suggestions
    assert not any(r.startswith("No available memory for the cache blocks") for r in est.reasons)
    text = " | ".join(est.suggestions)
    assert "--max-model-len" not in text.replace("vramlab --max-model-len", "")
    for t in est.suggestions:
        changes: dict[str, object] = {}
        if tp := re.search(r"--tp-size (\d+)", t):
            changes["tensor_parallel_size"] = int(tp.group(1))
        if ctx := re.search(r"--context-length (\d+)", t):
            changes["max_model_len"] = int(ctx.group(1))
        if "--kv-cache-dtype fp8_e5m2" in t:
            changes["kv_cache_dtype"] = "fp8"
        if "FP8 checkpoint" in t:
            changes["quantization"] = "fp8"
        if "4-bit AWQ" in t:
            changes["quantization"] = "awq"
        if changes:
            assert estimate(m, T4, s.with_(**changes)).fits, t


def test_llamacpp_is_told_ctx_size_over_its_slots_and_it_fits():
    m = spec(QWEN3_8B)
    s = EngineSettings(engine="llama.cpp", ctx_size=262144, parallel=4, fit=False)
    est = estimate(m, RTX4090, s)
    assert not est.fits
    shorter = est.suggestions[0]
    assert shorter.startswith("lower the context to") and "--parallel 4" in shorter, est.suggestions
    c = _number(r"--ctx-size (\d+)", shorter)
    assert c < 262144 and estimate(m, RTX4090, s.with_(ctx_size=c)).fits
    assert not estimate(m, RTX4090, s.with_(ctx_size=c + 4 * 256)).fits
    q8 = [t for t in est.suggestions if "-ctk q8_0" in t]
    assert q8, est.suggestions
    c8 = _number(r"--ctx-size (\d+)", q8[0])
    assert c8 > c  # the smaller cache type holds a longer context ...
    assert estimate(
        m, RTX4090, s.with_(ctx_size=c8, kv_cache_dtype="q8_0", flash_attn=True)
    ).fits  # ... and fits


def test_vllm_keeps_quoting_its_own_refusal():
    est = estimate(spec(LLAMA_31_8B), L4, EngineSettings(max_model_len=131072, gpu_memory_utilization=0.9))
    assert not est.fits
    assert any(
        r.startswith("To serve at least one request with the model's max seq len (131072)")
        for r in est.reasons
    )
    assert est.suggestions[0].startswith("lower --max-model-len to ")
