"""safetensors headers: exact bytes per dtype from real files, sharded indexes, and junk input."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _sources_files import (
    safetensors_bytes,
    tiny_llama_bytes,
    tiny_llama_tensors,
    write_safetensors,
    write_sharded_model,
)
from vramlab.errors import ConfigError
from vramlab.sources.safetensors import (
    parse_file_bytes,
    parse_header,
    read_directory_weights,
    read_index,
    read_safetensors_header,
)


def test_mixed_dtypes_give_exact_bytes_and_counts(tmp_path):
    # An AWQ-like layout: packed int4 in I32, fp16 scales, and a bf16 embedding.
    tensors = {
        "model.embed_tokens.weight": ("BF16", [1000, 64]),
        "model.layers.0.mlp.qweight": ("I32", [64, 32]),
        "model.layers.0.mlp.scales": ("F16", [2, 256]),
        "model.layers.0.mlp.qzeros": ("I32", [2, 32]),
        "model.norm.weight": ("F32", [64]),
        "scalar": ("F8_E4M3", []),
    }
    data_bytes = write_safetensors(tmp_path / "m.safetensors", tensors, metadata={"format": "pt"})
    h = read_safetensors_header(tmp_path / "m.safetensors")
    by_dtype: dict[str, Any] = {}
    for t in h.tensors:
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    assert by_dtype == {"BF16": 128_000, "I32": 8192 + 256, "F16": 1024, "F32": 256, "F8_E4M3": 1}
    assert sum(by_dtype.values()) == data_bytes
    assert h.metadata == {"format": "pt"}
    summary = read_directory_weights(tmp_path)
    assert summary is not None
    assert summary.total_bytes == data_bytes
    assert summary.param_count == 64_000 + 2048 + 512 + 64 + 64 + 1
    assert summary.files == ("m.safetensors",)


def test_sharded_index_reads_every_shard(tmp_path):
    write_sharded_model(tmp_path)
    s = read_index(tmp_path / "model.safetensors.index.json")
    assert s.files == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    assert s.total_bytes == tiny_llama_bytes() and s.bytes_by_dtype == {"BF16": tiny_llama_bytes()}
    assert s.tensor_count == len(tiny_llama_tensors(range(2)))
    assert read_directory_weights(tmp_path) == s


def test_header_is_read_without_the_tensor_data(tmp_path, monkeypatch):
    """Only 8 + N bytes are read, however large the data section is."""
    path = tmp_path / "big.safetensors"
    write_safetensors(path, {"w": ("F32", [1024, 1024])})  # 4 MiB of data
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    import vramlab.infile

    real_open = vramlab.infile.open_input
    read_sizes = []

    def counting_open(*a, **kw):
        f = real_open(*a, **kw)
        real_read = f.read

        class F:
            def read(self, size=-1):
                read_sizes.append(size)
                return real_read(size)

            def fileno(self):
                return f.fileno()

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

        return F()

    monkeypatch.setattr(
        vramlab.infile, "open_input", counting_open
    )  # the one reader every input goes through
    assert read_safetensors_header(path).tensors[0].nbytes == 4 << 20
    assert read_sizes == [8, n]


def test_truncated_file_is_refused(tmp_path):
    data = safetensors_bytes({"w": ("F16", [64, 64])})
    (tmp_path / "cut.safetensors").write_bytes(data[:-100])
    with pytest.raises(ConfigError, match="truncated: tensors need"):
        read_safetensors_header(tmp_path / "cut.safetensors")


def test_index_naming_a_missing_shard(tmp_path):
    write_sharded_model(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConfigError, match="shard\\(s\\) missing"):
        read_index(tmp_path / "model.safetensors.index.json")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "../../etc/passwd"}})
    )
    with pytest.raises(ConfigError, match="invalid shard name"):
        read_index(tmp_path / "model.safetensors.index.json")


@pytest.mark.parametrize(
    "header, message",
    [
        (b"[]", "not a JSON object"),
        (b"{not json", "not valid UTF-8 JSON"),
        (b'{"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 3]}}', "should take 4 bytes"),
        (b'{"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 2]}}', "unknown dtype"),
        (b'{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', "invalid shape"),
        (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', "invalid data_offsets"),
        (
            b'{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},'
            b' "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}',
            "overlap",
        ),
        (b'{"__metadata__": [1]}', "__metadata__"),
    ],
)
def test_malformed_headers_name_the_problem(header, message):
    with pytest.raises(ConfigError, match=message):
        parse_header(header)


def test_absurd_header_length_is_refused_before_reading():
    with pytest.raises(ConfigError, match="exceeds"):
        parse_file_bytes(struct.pack("<Q", 1 << 40) + b"{}")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_junk_bytes_raise_only_config_error(data):
    try:
        parse_file_bytes(data)
    except ConfigError:
        pass


_VALID = safetensors_bytes(tiny_llama_tensors(range(1)), {"format": "pt"})


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(_VALID)), st.binary(max_size=8), st.integers(0, 400))
def test_truncated_or_corrupted_real_headers_raise_only_config_error(cut, patch, at):
    data = bytearray(_VALID[:cut])
    data[at : at + len(patch)] = patch
    try:
        parse_file_bytes(bytes(data))
    except ConfigError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 1 << 40) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
tensor_like = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "BF16", "I32", "F4", "Q9", 3]),
        "shape": st.lists(st.integers(-1, 64), max_size=3) | json_values,
        "data_offsets": st.lists(st.integers(-1, 1 << 20), min_size=0, max_size=3) | json_values,
    }
)


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(st.text(max_size=12), tensor_like | json_values, max_size=5))
def test_structured_junk_headers_raise_only_config_error(obj):
    try:
        h = parse_header(json.dumps(obj).encode())
    except ConfigError:
        return
    assert all(t.nbytes >= 0 for t in h.tensors)
