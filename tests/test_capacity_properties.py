"""Property tests: the capacity model behaves like memory does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from capacity_models import GEMMA3_4B, GPT_OSS_20B, LLAMA_31_8B, QWEN3_8B, spec
from vramlab.capacity import EngineSettings, estimate, get_gpu

MODELS = [spec(c) for c in (LLAMA_31_8B, QWEN3_8B, GEMMA3_4B, GPT_OSS_20B)]
GPUS = [get_gpu(n) for n in ("l4", "a100-80gb", "h100-80gb", "h200")]
model_st = st.sampled_from(MODELS)
gpu_st = st.sampled_from(GPUS)
len_st = st.integers(min_value=256, max_value=32768)


@settings(max_examples=60, deadline=None)
@given(model_st, gpu_st, len_st, len_st, st.sampled_from(["vllm", "sglang", "tgi"]))
def test_more_context_never_raises_concurrency(m, gpu, a, b, engine):
    lo, hi = sorted((a, b))
    e_lo = estimate(m, gpu, EngineSettings(engine=engine, max_model_len=lo), with_suggestions=False)
    e_hi = estimate(m, gpu, EngineSettings(engine=engine, max_model_len=hi), with_suggestions=False)
    assert e_hi.max_concurrency <= e_lo.max_concurrency + 1e-9


@settings(max_examples=60, deadline=None)
@given(model_st, gpu_st, len_st, len_st, st.integers(1, 8), st.sampled_from(["llama.cpp", "transformers"]))
def test_more_context_never_needs_less_memory(m, gpu, a, b, seqs, engine):
    lo, hi = sorted((a, b))
    # llama.cpp with --fit on (its default) moves layers to the host when a longer context does not fit, so the
    # card's share can drop; the property holds for a fixed placement (fit off), where more context is more memory.
    kw = dict(parallel=seqs, ctx_size=None, fit=False) if engine == "llama.cpp" else dict(max_num_seqs=seqs)
    e_lo = estimate(m, gpu, EngineSettings(engine=engine, max_model_len=lo, **kw), with_suggestions=False)
    e_hi = estimate(m, gpu, EngineSettings(engine=engine, max_model_len=hi, **kw), with_suggestions=False)
    assert e_hi.used_bytes >= e_lo.used_bytes


@settings(max_examples=60, deadline=None)
@given(model_st, gpu_st, st.floats(0.5, 0.97), st.floats(0.5, 0.97))
def test_higher_utilization_never_shrinks_the_pool(m, gpu, a, b):
    lo, hi = sorted((a, b))
    e_lo = estimate(
        m, gpu, EngineSettings(gpu_memory_utilization=lo, max_model_len=4096), with_suggestions=False
    )
    e_hi = estimate(
        m, gpu, EngineSettings(gpu_memory_utilization=hi, max_model_len=4096), with_suggestions=False
    )
    assert e_hi.kv_cache_bytes >= e_lo.kv_cache_bytes
    assert e_hi.kv_cache_tokens >= e_lo.kv_cache_tokens


@settings(max_examples=40, deadline=None)
@given(model_st, st.sampled_from([1, 2, 4]))
def test_tp_never_increases_weights_per_gpu(m, tp):
    if m.num_attention_heads % tp:
        return
    one = estimate(m, GPUS[2], EngineSettings(max_model_len=4096), with_suggestions=False)
    many = estimate(
        m, GPUS[2], EngineSettings(max_model_len=4096, tensor_parallel_size=tp), with_suggestions=False
    )
    assert many.weights_bytes <= one.weights_bytes
    assert many.kv_bytes_per_token <= one.kv_bytes_per_token
