"""GGUF files written with gguf.GGUFWriter: metadata to ModelSpec, exact tensor bytes, junk files."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _sources_files import write_gguf
from vramlab.errors import ConfigError
from vramlab.sources import resolve_model
from vramlab.sources.gguf_file import read_gguf_facts, spec_from_gguf


def test_llama_gguf_to_spec_with_exact_bytes(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tie=False)
    spec = spec_from_gguf(path)
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads) == (2, 256, 4, 2)
    assert spec.head_dim == 64  # from attention.key_length, not 256 // 4
    assert spec.vocab_size == 512 and spec.max_position_embeddings == 4096 and spec.intermediate_size == 512
    assert spec.tie_word_embeddings is False
    # Q8_0 stores 32 weights in 34 bytes; embedding and output are f16; norms f32.
    q8 = 2 * (256 * 256 + 512 * 256) // 32 * 34
    f16 = 2 * (512 * 256) * 2
    f32 = 2 * 256 * 4
    assert spec.weights_bytes_by_dtype == {"F16": f16, "F32": f32, "Q8_0": q8}
    assert spec.weights_bytes_exact == q8 + f16 + f32
    assert spec.param_count_exact == 2 * (256 * 256 + 512 * 256) + 2 * 512 * 256 + 2 * 256
    assert spec.weights_source == "GGUF tensors"
    assert spec.quant is not None
    assert spec.quant.method == "gguf" and spec.quant.gguf_type == "Q8_0"
    assert spec.name == "tiny-llama" and spec.source == str(path)


def test_dominant_k_quant_type_and_file_type(tmp_path):
    path = tmp_path / "q4k.gguf"
    write_gguf(path, quant_type="Q4_K")
    facts = read_gguf_facts(path)
    assert facts.dominant_type == "Q4_K" and facts.file_type == "MOSTLY_Q8_0"
    # Q4_K: 256 weights in 144 bytes.
    assert facts.tensor_bytes_by_type["Q4_K"] == 2 * (256 * 256 + 512 * 256) // 256 * 144
    quant = spec_from_gguf(path).quant
    assert quant is not None and quant.gguf_type == "Q4_K"


def test_gemma3_sliding_pattern_and_moe_fields(tmp_path):
    path = tmp_path / "g.gguf"
    write_gguf(path, "gemma3", layers=6, extra={"sliding_window": 512})
    spec = spec_from_gguf(path)
    assert spec.kinds == ("sliding",) * 5 + ("full",) and spec.sliding_window == 512

    path = tmp_path / "moe.gguf"
    write_gguf(
        path, "qwen3moe", extra={"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 96}
    )
    spec = spec_from_gguf(path)
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size) == (8, 2, 96)
    assert spec.model_type == "qwen3_moe"


def test_hybrid_ssm_layers_from_per_layer_kv_heads(tmp_path):
    path = tmp_path / "h.gguf"
    write_gguf(
        path,
        "granitehybrid",
        layers=4,
        kv=[0, 0, 0, 2],
        extra={
            "ssm_state_size": 128,
            "ssm_inner_size": 512,
            "ssm_conv_kernel": 4,
            "ssm_group_count": 1,
            "ssm_time_step_rank": 8,
        },
    )
    spec = spec_from_gguf(path)
    assert spec.kinds == ("mamba", "mamba", "mamba", "full")
    assert (spec.mamba_d_state, spec.mamba_n_heads, spec.mamba_head_dim, spec.num_kv_heads) == (128, 8, 64, 2)


def test_resolve_model_reads_a_gguf_path_and_a_directory_holding_one(tmp_path):
    path = tmp_path / "m" / "model-Q8_0.gguf"
    path.parent.mkdir()
    write_gguf(path)
    assert resolve_model(str(path)).weights_source == "GGUF tensors"
    assert resolve_model(str(path.parent)).weights_bytes_exact == spec_from_gguf(path).weights_bytes_exact


def test_missing_metadata_is_named(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "bare.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConfigError, match="llama.embedding_length"):
        spec_from_gguf(path)


def _valid_gguf_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "v.gguf")
        write_gguf(p)  # type: ignore[arg-type]
        with open(p, "rb") as f:
            return f.read()


_VALID = _valid_gguf_bytes()


def _read(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.gguf")
        with open(p, "wb") as f:
            f.write(data)
        try:
            spec_from_gguf(p)
        except ConfigError:
            pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_junk_files_raise_only_config_error(data):
    _read(b"GGUF" + data if data[:1] == b"\x00" else data)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(_VALID) - 1), st.binary(min_size=1, max_size=8), st.integers(0, 2000))
def test_truncated_or_corrupted_gguf_raise_only_config_error(cut, patch, at):
    data = bytearray(_VALID[: max(cut, at + len(patch))])
    data[at : at + len(patch)] = patch
    _read(bytes(data))
