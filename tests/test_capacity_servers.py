"""transformers and llama.cpp: dtype, serving mode, context limits and the two llama.cpp servers'
defaults (sources in each policy's docstring)."""

from __future__ import annotations

import pytest

from capacity_models import LLAMA_31_8B, QWEN3_8B, spec
from vramlab.capacity import GIB, EngineSettings, estimate, get_gpu
from vramlab.capacity.engines.llamacpp import KV_PAD
from vramlab.errors import ConfigError

H100, L4 = get_gpu("h100-80gb"), get_gpu("l4")


def f32_checkpoint():
    """A checkpoint stored in F32 (header bytes 4 per parameter), config saying float32."""
    m = spec({**QWEN3_8B, "torch_dtype": "float32"})
    header = int(8.19e9 * 4)
    return m.with_(
        weights_bytes_exact=header,
        weights_bytes_by_dtype={"F32": header},
        weights_source="safetensors headers",
    )


# --- transformers ------------------------------------------------------------------------------


def test_transformers_5_loads_the_checkpoints_own_dtype():
    m = f32_checkpoint()
    est = estimate(m, H100, EngineSettings(engine="transformers", max_model_len=2048))
    assert est.engine_version.startswith("5.")
    w = est.component("weights")
    assert w is not None
    assert w.provenance == "exact" and w.bytes == pytest.approx(m.weights_bytes_exact, rel=0.001)
    assert est.settings["dtype"] == "float32"
    # vLLM casts an F32 checkpoint to bf16 at load: half the header's bytes, still from the headers.
    served = estimate(m, H100, EngineSettings(engine_version="0.19.0", max_model_len=2048))
    assert served.weights_bytes == pytest.approx(m.weights_bytes_exact / 2, rel=0.01)


def test_transformers_4_loaded_float32_unless_told():
    m = spec(QWEN3_8B)
    v4 = estimate(m, H100, EngineSettings(engine="transformers", engine_version="4.57.0", max_model_len=2048))
    v5 = estimate(m, H100, EngineSettings(engine="transformers", engine_version="5.0.0", max_model_len=2048))
    assert v4.settings["dtype"] == "float32" and v5.settings["dtype"] == "bfloat16"
    assert v4.weights_bytes == pytest.approx(2 * v5.weights_bytes, rel=0.01)
    assert any("float32" in n for n in v4.notes)


def test_transformers_refuses_a_context_above_the_models_limit():
    m = spec({**QWEN3_8B, "max_position_embeddings": 40960})
    with pytest.raises(ConfigError, match="exceeds the model's maximum context 40960"):
        estimate(m, H100, EngineSettings(engine="transformers", max_model_len=65536))


def test_transformers_serve_is_one_request_at_a_time_without_continuous_batching():
    m = spec(QWEN3_8B)
    serial = estimate(m, H100, EngineSettings(engine="transformers", max_model_len=4096))
    batched = estimate(
        m, H100, EngineSettings(engine="transformers", max_model_len=4096, continuous_batching=True)
    )
    assert serial.max_concurrency == 1.0 and batched.max_concurrency > 10
    assert serial.settings["continuous_batching"] is False


# --- llama.cpp -----------------------------------------------------------------------------------


def llamacpp(**kw):
    return estimate(spec(LLAMA_31_8B), L4, EngineSettings(engine="llama.cpp", **kw))


def test_flash_attention_off_adds_the_kq_matrix_and_ubatch_scales_the_buffer():
    on = llamacpp(ctx_size=8192, flash_attn=True)
    off = llamacpp(ctx_size=8192, flash_attn=False)
    kq = 4 * 8192 * 512 * 32  # n_kv x n_ubatch x heads in f32
    # without flash attention the KQ matrix (and its mask) is the peak: it dwarfs the output phase
    assert (
        kq < off.activation_peak_bytes < kq * 1.15
        and off.activation_peak_bytes > on.activation_peak_bytes + kq / 2
    )
    big = llamacpp(ctx_size=8192, flash_attn=True, n_ubatch=2048)
    assert big.activation_peak_bytes > 3 * on.activation_peak_bytes * 0.9
    assert big.settings["n_ubatch"] == 2048


def test_separate_k_and_v_cache_types():
    f16 = llamacpp(ctx_size=8192, flash_attn=True)
    q8 = llamacpp(ctx_size=8192, flash_attn=True, kv_cache_dtype="q8_0")
    mixed = llamacpp(ctx_size=8192, flash_attn=True, kv_cache_dtype="q8_0", cache_type_v="f16")
    # Llama 3.1 8B: 32 layers x 8 KV heads x 128 = 32,768 values each for K and V per cell.
    assert f16.kv_cache_bytes == 8192 * 32 * 2 * 8 * 128 * 2
    assert mixed.kv_cache_bytes == pytest.approx((f16.kv_cache_bytes + q8.kv_cache_bytes) / 2, rel=1e-6)
    assert mixed.settings["cache_type_k"] == "q8_0" and mixed.settings["cache_type_v"] == "f16"


def test_quantized_v_cache_needs_flash_attention():
    with pytest.raises(ConfigError, match="quantized V cache .* requires flash_attn"):
        llamacpp(ctx_size=8192, flash_attn=False, kv_cache_dtype="q8_0")


def test_a_context_above_the_trained_length_is_planned_with_llamacpps_warning():
    m = spec({**QWEN3_8B, "max_position_embeddings": 40960})
    est = estimate(m, H100, EngineSettings(engine="llama.cpp", ctx_size=65536, parallel=1))
    assert est.max_model_len == 65536
    assert any("n_ctx_per_seq (65536) > n_ctx_train (40960)" in n for n in est.notes)


def test_upstream_llama_server_defaults_four_unified_slots_and_the_models_context():
    est = llamacpp(fit=False)  # default b9300: after PR #16736; --fit off keeps the model's context
    assert est.settings["parallel"] == 4 and est.settings["kv_unified"] is True
    assert (
        est.settings["ctx_size"] == 131072 and est.max_model_len == 131072
    )  # unified: each slot may use all
    cut = llamacpp()  # --fit (on by default) cuts the 16 GiB of KV that the L4 cannot hold
    assert cut.settings["ctx_size"] < 131072 and cut.extra["fit"]["changed"] == ["ctx_size"]
    assert est.settings["flash_attn"] is True
    old = estimate(spec(LLAMA_31_8B), L4, EngineSettings(engine="llama.cpp", engine_version="b6000"))
    assert old.settings["parallel"] == 1 and old.settings["kv_unified"] is False


def test_llama_cpp_python_server_defaults():
    est = llamacpp(llamacpp_server="llama-cpp-python")
    assert est.settings["ctx_size"] == 2048 and est.settings["parallel"] == 1
    assert est.settings["flash_attn"] is False and est.settings["n_ubatch"] == 512
    assert est.kv_cache_bytes == KV_PAD * 8 * 32 * 2 * 8 * 128 * 2
    assert any("n_gpu_layers=0" in n for n in est.notes)
    assert est.weights_bytes > 10 * GIB  # planned fully offloaded, as the note says
