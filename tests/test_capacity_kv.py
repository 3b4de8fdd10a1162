"""KV bytes per token against figures published in engine logs and research (not re-derived here)."""

from __future__ import annotations

import pytest

from capacity_models import (
    GEMMA3_4B,
    GPT_OSS_20B,
    HYBRID,
    KIMI_VL,
    LLAMA_31_8B,
    LLAMA_32_3B,
    PHI_4,
    QWEN3_8B,
    spec,
)
from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.kv import FP8_DS_MLA_BYTES, kv_bytes_per_token, kv_elem_bytes, state_bytes_per_sequence
from vramlab.errors import ConfigError

H100 = get_gpu("h100-80gb")


@pytest.mark.parametrize(
    ("config", "published"),
    [
        (LLAMA_32_3B, 114_688),  # research 7a: 28 x 8 x 128 x 2 x 2
        (PHI_4, 204_800),  # research 7a: 406 blocks in 1.24 GiB
        (QWEN3_8B, 147_456),  # research 7a: 65,376 tokens in 8.98 GiB
        (LLAMA_31_8B, 131_072),
    ],
)
def test_gqa_bytes_per_token_match_published(config, published):
    assert kv_bytes_per_token(spec(config), "auto", "bfloat16", 1) == published


def test_explicit_head_dim_is_used_not_hidden_over_heads():
    # Qwen3-8B: hidden/heads = 128 too, but Gemma 3 4B has head_dim 256 with hidden 2560 / 8 heads = 320.
    g = spec(GEMMA3_4B)
    assert g.head_dim == 256
    per_layer = kv_bytes_per_token(g, "auto", "bfloat16", 1) // 34
    assert per_layer == 2 * 4 * 256 * 2


def test_tp_splits_kv_heads_and_replicates_beyond_them():
    m = spec(LLAMA_31_8B)  # 8 KV heads
    one = kv_bytes_per_token(m, "auto", "bfloat16", 1)
    assert kv_bytes_per_token(m, "auto", "bfloat16", 2) == one // 2
    assert kv_bytes_per_token(m, "auto", "bfloat16", 8) == one // 8
    # TP 16 > 8 KV heads: each rank still holds one whole head (replication), not half a head.
    assert kv_bytes_per_token(m, "auto", "bfloat16", 16) == one // 8


def test_mla_latent_inside_text_config_no_factor_two_no_tp_split():
    m = spec(KIMI_VL)
    assert m.is_mla
    # vLLM MLAAttentionSpec: (512 + 64) x 2 B = 1152 B per token per layer, 27 layers (31,104 B; llm-d r038).
    assert kv_bytes_per_token(m, "auto", "bfloat16", 1) == 31_104
    assert kv_bytes_per_token(m, "auto", "bfloat16", 4) == 31_104
    assert kv_bytes_per_token(m, "fp8_ds_mla", "bfloat16", 1) == FP8_DS_MLA_BYTES * 27


def test_kv_dtype_follows_the_model_dtype_not_the_weight_format():
    m = spec(GPT_OSS_20B)  # MXFP4 weights, bf16 KV (llm-d anchor r040: the planner used 0.53 B/elem)
    assert kv_elem_bytes("auto", "bfloat16") == 2
    assert kv_bytes_per_token(m, "auto", "bfloat16", 2) == 24 * 4 * 64 * 2 * 2  # 24,576 B/token/GPU at TP2
    assert kv_bytes_per_token(m, "fp8", "bfloat16", 2) == 24 * 4 * 64 * 2


def test_unknown_kv_dtype_is_a_clear_error():
    with pytest.raises(ConfigError, match="kv-cache-dtype"):
        kv_elem_bytes("fp7", "bfloat16")


def test_layer_patterns():
    g = spec(GEMMA3_4B)
    assert g.count("full") == 5 and g.count("sliding") == 29  # every 6th layer global
    o = spec(GPT_OSS_20B)
    assert o.count("full") == 12 and o.count("sliding") == 12
    h = spec(HYBRID)
    assert h.count("mamba") == 6 and h.count("full") == 2 and h.count("mlp") == 6


def test_mamba_state_is_per_sequence_and_attention_kv_per_token():
    h = spec(HYBRID)
    assert kv_bytes_per_token(h, "auto", "bfloat16", 1) == 2 * (2 * 8 * 128 * 2)  # 2 attention layers only
    state = state_bytes_per_sequence(h, "bfloat16", 1, range(h.num_layers))
    # 6 Mamba-2 layers: SSM 128 heads x 64 x 128 state + conv (8192 + 2 x 8 x 128) x 3, bf16.
    assert state == 6 * (128 * 64 * 128 + (8192 + 2048) * 3) * 2
    est = estimate(h, H100, EngineSettings(max_model_len=8192, engine_version="0.19.0"))
    assert est.per_sequence_state_bytes == state
    assert est.block_size > 16  # vLLM grows the attention block to the mamba page


def test_gpt_oss_hybrid_concurrency_matches_vllm_019():
    # llm-d r040: gpt-oss-20b TP2, 59.32 GiB KV -> 316.07x at 8192 (sliding groups need 513 blocks).
    m = spec(GPT_OSS_20B)
    s = EngineSettings(
        engine_version="0.19.0",
        tensor_parallel_size=2,
        max_model_len=8192,
        kv_cache_memory_bytes=int(59.32 * (1 << 30)),
    )
    est = estimate(m, H100, s)
    assert est.max_concurrency == pytest.approx(316.07, rel=0.002)


def test_every_cache_type_an_engine_accepts_is_planned_in_its_block_bytes():
    """llama.cpp's --cache-type-k/-v types at ggml's block sizes (per 32 values), TGI's fp8_e4m3fn as one
    byte; an engine's own spelling is never refused as unknown."""
    import subprocess
    import sys

    from vramlab.capacity.kv import kv_elem_bytes

    ggml = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}
    assert {t: kv_elem_bytes(t, "bfloat16") * 32 for t in ggml} == ggml
    assert kv_elem_bytes("fp8_e4m3fn", "bfloat16") == kv_elem_bytes("fp8_e5m2", "bfloat16") == 1.0
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "plan",
            "--model",
            "qwen3-8b",
            "--gpu",
            "l4",
            "--engine",
            "tgi",
            "--kv-cache-dtype",
            "fp8_e4m3fn",
            "--offline",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode in (0, 1) and "unknown" not in out.stderr, out.stderr
