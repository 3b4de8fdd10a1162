"""vLLM's policy by era, checked against published start-up logs (benchmarks/data, docs/research/capacity-anchors.md §7)."""

from __future__ import annotations

import pytest

from _narrow import some
from capacity_models import LLAMA_31_8B, LLAMA_32_3B, QWEN3_8B, part, spec
from vramlab.capacity import GIB, Constants, EngineSettings, estimate, get_gpu
from vramlab.capacity.engines.common import Context
from vramlab.capacity.engines.vllm_eras import defaults, engine_kind
from vramlab.errors import ConfigError

H100, A100, T4, L4 = (get_gpu(n) for n in ("h100-80gb", "a100-80gb", "t4", "l4"))


def test_llama_8b_h100_v019_matches_the_log():
    # vLLM 0.19.0, util 0.95, 8192: weights 14.99, torch peak 1.89, non-torch 0.25, KV 58.11 GiB, 476,016 tokens.
    est = estimate(
        spec(LLAMA_31_8B),
        H100,
        EngineSettings(engine_version="0.19.0", gpu_memory_utilization=0.95, max_model_len=8192),
    )
    assert est.weights_bytes / GIB == pytest.approx(14.99, abs=0.02)
    assert est.activation_peak_bytes / GIB == pytest.approx(1.89, rel=0.05)
    assert est.kv_cache_bytes / GIB == pytest.approx(58.11, rel=0.01)
    assert est.kv_cache_tokens == pytest.approx(476_016, rel=0.01)
    assert est.max_concurrency == pytest.approx(58.11, rel=0.01)
    assert est.fits


def test_v0_budget_closes_like_the_three_line_summary():
    # Unsloth Llama-3.2-3B, vLLM 0.8.1 V0 on A100-40GB util 0.79: W 6.25, NT 0.09, act 1.49 -> KV 23.46.
    est = estimate(
        spec(LLAMA_32_3B),
        get_gpu("a100-40gb"),
        EngineSettings(
            engine_version="0.8.1",
            vllm_engine="v0",
            gpu_memory_utilization=0.79,
            max_model_len=2048,
            max_num_seqs=320,
            max_num_batched_tokens=2048,
            dtype="bfloat16",
            api_server=False,
        ),
    )
    assert est.settings["engine_mode"] == "v0"
    assert est.kv_cache_bytes / GIB == pytest.approx(23.46, rel=0.04)
    # V0 concurrency is blocks x block_size / max_model_len.
    assert est.max_concurrency == pytest.approx(est.num_blocks * 16 / 2048)


def test_engine_generation_and_defaults_follow_the_release():
    m = spec(LLAMA_31_8B)
    c = Constants.defaults()
    assert engine_kind(Context(m, H100, EngineSettings(engine_version="0.7.3"), c)) == "v0"
    assert engine_kind(Context(m, H100, EngineSettings(engine_version="0.8.5"), c)) == "v1"
    with pytest.raises(ConfigError, match="no V0"):
        engine_kind(Context(m, H100, EngineSettings(engine_version="0.12.0", vllm_engine="v0"), c))
    util, seqs, mbt = defaults(Context(m, H100, EngineSettings(engine_version="0.19.0"), c), "v1")
    assert (util, seqs, mbt) == (0.9, 1024, 8192)
    util, seqs, mbt = defaults(Context(m, A100, EngineSettings(engine_version="0.19.0"), c), "v1")
    assert (seqs, mbt) == (256, 2048)  # the A100 exception (vLLM PR #17885)
    util, _, _ = defaults(Context(m, H100, EngineSettings(engine_version="0.20.0"), c), "v1")
    assert util == 0.92  # the 0.20.0 wheel's config/cache.py: Field(default=0.92)


def test_cuda_graphs_enter_the_budget_from_020():
    # The 0.20.0 wheel: envs VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "1" (0.19.1: "0").
    m = spec(LLAMA_31_8B)
    old = estimate(
        m, H100, EngineSettings(engine_version="0.19.1", gpu_memory_utilization=0.9, max_model_len=8192)
    )
    new = estimate(
        m, H100, EngineSettings(engine_version="0.20.0", gpu_memory_utilization=0.9, max_model_len=8192)
    )
    assert not part(old, "cuda_graphs").in_budget and part(new, "cuda_graphs").in_budget
    assert new.kv_cache_bytes == pytest.approx(old.kv_cache_bytes - new.cuda_graph_bytes, abs=2)
    eager = estimate(
        m,
        H100,
        EngineSettings(
            engine_version="0.21.0", gpu_memory_utilization=0.9, max_model_len=8192, enforce_eager=True
        ),
    )
    assert eager.component("cuda_graphs") is None and eager.kv_cache_bytes > new.kv_cache_bytes


def test_graphs_outside_the_budget_must_fit_the_headroom():
    est = estimate(
        spec(LLAMA_31_8B),
        H100,
        EngineSettings(engine_version="0.19.0", gpu_memory_utilization=0.999, max_model_len=8192),
    )
    assert not est.fits
    assert any("short" in r or "Free memory" in r for r in est.reasons)


def test_tp_must_divide_heads_and_max_model_len_is_checked():
    m = spec(LLAMA_31_8B)
    with pytest.raises(ConfigError, match="divisible"):
        estimate(m, H100, EngineSettings(tensor_parallel_size=3))
    with pytest.raises(ConfigError, match="greater than the derived max_model_len"):
        estimate(m, H100, EngineSettings(max_model_len=262144))
    with pytest.raises(ConfigError, match="--gpu-memory-utilization: must be at most 1"):
        estimate(m, H100, EngineSettings(gpu_memory_utilization=1.5))


def test_kv_cache_memory_overrides_the_budget():
    est = estimate(
        spec(LLAMA_31_8B), H100, EngineSettings(kv_cache_memory_bytes=10 * GIB, max_model_len=8192)
    )
    assert est.kv_cache_bytes == 10 * GIB
    assert est.kv_cache_tokens == 10 * GIB // (131_072 * 16) * 16


def test_pipeline_parallel_blocks_are_the_minimum_over_stages():
    # llm-d r025: PP2 rank 0 prints 66.54 GiB; the last stage holds the LM head, so tokens use its blocks.
    est = estimate(
        spec(LLAMA_31_8B),
        H100,
        EngineSettings(
            engine_version="0.19.0", gpu_memory_utilization=0.95, max_model_len=8192, pipeline_parallel_size=2
        ),
    )
    assert est.kv_cache_bytes / GIB == pytest.approx(66.54, rel=0.01)
    assert est.kv_cache_tokens == pytest.approx(1_075_312, rel=0.01)
    assert est.kv_cache_tokens < est.kv_cache_bytes // 65_536  # fewer than rank 0 alone could hold


def test_other_processes_trigger_the_startup_refusal():
    est = estimate(
        spec(QWEN3_8B),
        L4,
        EngineSettings(gpu_memory_utilization=0.9, max_model_len=4096, other_processes_bytes=4 * GIB),
    )
    assert not est.fits
    assert est.reasons[0].startswith("Free memory on device")


def test_suggestions_fit_when_applied():
    m = spec(QWEN3_8B)
    s = EngineSettings(gpu_memory_utilization=0.9, max_model_len=40960, max_num_seqs=256)
    est = estimate(m, T4, s)
    assert not est.fits and est.suggestions
    first = est.suggestions[0]
    if first.startswith("lower --max-model-len to "):
        length = int(first.split()[-5])
        assert estimate(m, T4, s.with_(max_model_len=length)).fits
        assert not estimate(m, T4, s.with_(max_model_len=length + 64)).fits


def test_bands_contain_the_value_and_pessimistic_is_smaller():
    est = estimate(spec(LLAMA_31_8B), H100, EngineSettings(max_model_len=8192))
    for c in est.components:
        assert c.low_bytes <= c.bytes <= c.high_bytes
    assert some(est.pessimistic).max_concurrency < est.max_concurrency < some(est.optimistic).max_concurrency
