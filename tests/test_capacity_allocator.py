"""PyTorch's caching-allocator rounding (c10/cuda/CUDACachingAllocator.cpp) and what it does to the
weights SGLang reports: SGLang reads free memory with mem_get_info after empty_cache
(`get_available_gpu_memory`, python/sglang/srt/utils.py, every release), so segment rounding counts."""

from __future__ import annotations

from typing import Any

import pytest

from vramlab.capacity import GIB, EngineSettings, estimate, get_gpu
from vramlab.capacity import allocator as A
from vramlab.sources import resolve_model

MIB = 1 << 20


def test_large_requests_round_to_2_mib_segments():
    assert A.reserved_bytes([int(17.5 * MIB)]) == 18 * MIB  # Qwen2.5-32B qkv_proj at TP 4
    # 12.5 MiB: a 14 MiB segment; the 1.5 MiB split off stays reserved while the tensor lives.
    assert A.reserved_bytes([int(12.5 * MIB)]) == 14 * MIB
    assert A.reserved_bytes([128 * MIB]) == 128 * MIB  # a multiple of 2 MiB costs nothing extra


def test_requests_under_10_mib_share_20_mib_segments_best_fit():
    # 9 MiB + 9 MiB fit one 20 MiB segment (2 MiB left, split off: > 1 MiB); the third opens another.
    assert A.reserved_bytes([9 * MIB] * 2) == 20 * MIB
    assert A.reserved_bytes([9 * MIB] * 3) == 40 * MIB
    # a 1.5 MiB request takes the 2 MiB remainder (best fit) instead of a new segment
    assert A.reserved_bytes([9 * MIB, 9 * MIB, int(1.5 * MIB)]) == 20 * MIB


def test_small_requests_pack_into_2_mib_segments():
    assert A.reserved_bytes([10_000] * 100) == 2 * MIB  # 100 x 10,240 B (rounded to 512) = 0.98 MiB
    assert A.rounding_bytes([100]) == 2 * MIB - 100


def test_sglang_weights_include_the_rounding_seen_in_a_real_log():
    # r090 (benchmarks/data): SGLang ~0.4.3, QwQ-32B (Qwen2.5-32B architecture) TP 4 on L4:
    # "Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=6.09 GB, mem usage=15.54 GB."
    # The tensors' bytes are 15.27 GiB; o_proj (12.5 MiB) and gate_up/down/qkv round up per layer.
    m = resolve_model("Qwen/Qwen2.5-32B-Instruct", offline=True)
    s = EngineSettings(
        engine="sglang",
        engine_version="0.4.3",
        tensor_parallel_size=4,
        mem_fraction_static=0.85,
        chunked_prefill_size=2048,
    )
    est = estimate(m, get_gpu("l4"), s)
    w = est.component("weights")
    assert w is not None
    assert w.bytes / GIB == pytest.approx(15.54, abs=0.08)
    assert "allocator segment rounding" in w.note
    vllm = estimate(
        m, get_gpu("l4"), EngineSettings(engine_version="0.19.0", tensor_parallel_size=4, max_model_len=8192)
    )
    assert 0.18 < (w.bytes - vllm.weights_bytes) / GIB < 0.3  # vLLM reports allocated bytes, SGLang segments
    # "KV Cache is allocated. #tokens: 46611": the planned pool is within 10 % (was +15.6 %), over by the
    # CUDA context that log shows (0.73 GiB before NCCL) above the constant's 0.51 GiB.
    assert 46_611 < est.kv_cache_tokens < 46_611 * 1.10


def test_unmodelled_layouts_add_nothing():
    from vramlab.capacity import Constants
    from vramlab.capacity.engines.common import Context
    from vramlab.capacity.engines.sglang import weight_tensor_sizes

    m = resolve_model("deepseek-ai/DeepSeek-V2-Lite-Chat", offline=True)  # MLA: layout not modelled
    ctx = Context(m, get_gpu("h100-80gb"), EngineSettings(engine="sglang"), Constants.defaults())
    assert weight_tensor_sizes(ctx) is None


def test_sglang_request_to_token_map_sits_in_the_reserve():
    # r090's log: "Memory pool end. avail mem=2.09 GB" after "avail mem=6.09 GB" and a 2.84 GiB KV pool:
    # the other ~1 GiB is ReqToTokenPool, int32 x (2048 + 1) requests x (131072 + 4) positions.
    m = resolve_model("Qwen/Qwen2.5-32B-Instruct", offline=True)
    s = EngineSettings(
        engine="sglang",
        tensor_parallel_size=4,
        mem_fraction_static=0.85,
        chunked_prefill_size=2048,
        max_model_len=131072,
        allow_long_max_model_len=True,
    )
    est = estimate(m, get_gpu("l4"), s)
    pool = est.component("req_to_token_pool")
    assert pool is not None
    assert not pool.in_budget
    assert pool.bytes / GIB == pytest.approx(2049 * 131076 * 4 / GIB, rel=0.001) and pool.bytes / GIB > 0.99
    assert est.settings["max_running_requests"] == 2048


def test_sglang_context_is_an_unknown_term_with_a_widened_band():
    # r090's log: 22.49 GiB L4, "Init torch distributed ends. mem usage=0.13 GB", "Load weight begin. avail
    # mem=21.63 GB": 0.73 GiB held before NCCL. The constant is vLLM 0.19's 0.51 GiB; the band must hold 0.73.
    m = resolve_model("Qwen/Qwen2.5-32B-Instruct", offline=True)
    est = estimate(
        m, get_gpu("l4"), EngineSettings(engine="sglang", tensor_parallel_size=4, mem_fraction_static=0.85)
    )
    ctx = est.component("cuda_context")
    assert ctx is not None
    assert ctx.low_bytes / GIB < 0.51 < 0.73 < ctx.high_bytes / GIB
    assert "unknown term, band widened" in ctx.note
    # and the KV band holds the logged pool: 46,611 tokens x 64 KiB
    kv = est.component("kv_cache")
    assert kv is not None
    assert kv.low_bytes <= 46_611 * 65_536 <= kv.high_bytes


def test_sglang_mla_keeps_absorbed_copies_of_kv_b_proj():
    # python/sglang/srt/models/deepseek_v2.py post_load_weights: w_kc, w_vc = kv_b_proj split and made
    # contiguous (bind_or_assign), kept beside kv_b_proj. DeepSeek-V3 at TP 8: 16 heads x (128 + 128) x 512
    # x 61 layers x 2 bytes = 244 MiB per GPU.
    m = resolve_model("deepseek-ai/DeepSeek-V3", offline=True)
    s: dict[str, Any] = dict(tensor_parallel_size=8, max_model_len=8192)
    sg = estimate(m, get_gpu("h200"), EngineSettings(engine="sglang", engine_version="0.5.6", **s))
    v = estimate(m, get_gpu("h200"), EngineSettings(engine_version="0.19.0", **s))
    w = sg.component("weights")
    assert w is not None
    assert "w_kc/w_vc" in w.note
    assert (w.bytes - v.weights_bytes) == 16 * 256 * 512 * 61 * 2
    assert w.low_bytes <= v.weights_bytes + 16 * 256 * 512 * 61  # the FP8 (DeepGEMM bmm) path keeps half
