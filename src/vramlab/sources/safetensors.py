"""Exact weight sizes from safetensors headers, without reading tensor data.

A `.safetensors` file starts with an 8-byte little-endian header length N, then N bytes of JSON:
`{"tensor name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
"__metadata__": {...}}`; tensor data follows. Reading the header gives every tensor's dtype and
byte size, which is the exact weights figure (quantized packs, scales and zeros included).

The parser works on bytes (`parse_header_length`, `parse_header`) so the Hub reader can feed it
what two HTTP range requests returned; `read_safetensors_header` and `read_index` add file I/O.
Malformed input raises `ConfigError`, never anything else.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramlab.errors import ConfigError

if TYPE_CHECKING:
    from vramlab.capacity.spec import ModelSpec

# The safetensors reference implementation refuses headers over 100 MB; so do we, so that a
# corrupt length never makes us allocate or download gigabytes.
MAX_HEADER_BYTES = 100_000_000
INDEX_NAME = "model.safetensors.index.json"

# Bits per element of the dtypes the format defines (sub-byte float formats are packed).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    header_bytes: int = 0  # N, the JSON length
    data_bytes: int = 0  # bytes the tensors' data section needs (max end offset)


@dataclass(frozen=True)
class WeightsSummary:
    """Totals over one or more safetensors files."""

    total_bytes: int
    bytes_by_dtype: dict[str, int] = field(compare=False, hash=False)
    param_count: int = 0  # stored elements: a packed int4 I32 counts as one element
    tensor_count: int = 0
    files: tuple[str, ...] = ()
    tensors: tuple[TensorInfo, ...] = field(default=(), compare=False, hash=False, repr=False)


def parse_header_length(first8: bytes, *, where: str = "safetensors data") -> int:
    """The JSON header length from a file's first 8 bytes."""
    if len(first8) < 8:
        raise ConfigError(f"{where}: truncated, {len(first8)} bytes where the 8-byte header length should be")
    n: int
    (n,) = struct.unpack("<Q", first8[:8])
    if n < 2:
        raise ConfigError(f"{where}: header length {n} is too small to hold a JSON object")
    if n > MAX_HEADER_BYTES:
        raise ConfigError(
            f"{where}: header length {n} exceeds {MAX_HEADER_BYTES} bytes; not a safetensors file?"
        )
    return n


def _tensor(name: str, raw: Any, where: str) -> tuple[TensorInfo, int, int]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: tensor {name!r} is not an object")
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype, str):
        raise ConfigError(f"{where}: tensor {name!r} has no dtype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ConfigError(f"{where}: tensor {name!r} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise ConfigError(f"{where}: tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    nbytes = end - begin
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise ConfigError(f"{where}: tensor {name!r} has unknown dtype {dtype!r}")
    expected = (math.prod(shape) * bits + 7) // 8
    if expected != nbytes:
        raise ConfigError(
            f"{where}: tensor {name!r} ({dtype} {shape}) should take {expected} bytes, data_offsets give {nbytes}"
        )
    return TensorInfo(name, dtype, tuple(shape), nbytes), begin, end


def parse_header(header_json: bytes, *, where: str = "safetensors header") -> SafetensorsHeader:
    """Parse the JSON header (the N bytes after the length) into tensor facts."""
    try:
        raw = json.loads(header_json.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{where}: header is not valid UTF-8 JSON ({exc.__class__.__name__})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: header is not a JSON object")
    metadata = raw.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise ConfigError(f"{where}: __metadata__ is not an object")
    tensors = []
    spans = []
    for name, value in raw.items():
        if name == "__metadata__":
            continue
        info, begin, end = _tensor(name, value, where)
        tensors.append(info)
        if end > begin:
            spans.append((begin, end, name))
    spans.sort()
    for (_, end_a, name_a), (begin_b, _, name_b) in zip(spans, spans[1:], strict=False):
        if begin_b < end_a:
            raise ConfigError(f"{where}: tensors {name_a!r} and {name_b!r} overlap")
    data_bytes = max((end for _, end, _ in spans), default=0)
    return SafetensorsHeader(
        tensors=tuple(tensors),
        metadata={str(k): str(v) for k, v in metadata.items()},
        header_bytes=len(header_json),
        data_bytes=data_bytes,
    )


def parse_file_bytes(data: bytes, *, where: str = "safetensors data") -> SafetensorsHeader:
    """Parse a header from a buffer that starts at byte 0 of the file (data may be cut short)."""
    n = parse_header_length(data[:8], where=where)
    if len(data) < 8 + n:
        raise ConfigError(f"{where}: truncated header ({len(data) - 8} of {n} bytes)")
    return parse_header(data[8 : 8 + n], where=where)


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """Read one file's header (8 + N bytes) and check the file is long enough for its tensors."""
    from vramlab.infile import open_input

    p = Path(path)
    try:
        with open_input(p, "safetensors file") as f:
            size = os.fstat(f.fileno()).st_size
            n = parse_header_length(f.read(8), where=str(p))
            blob = f.read(n)
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    if len(blob) < n:
        raise ConfigError(f"{p}: truncated header ({len(blob)} of {n} bytes)")
    header = parse_header(blob, where=str(p))
    if 8 + n + header.data_bytes > size:
        raise ConfigError(
            f"{p}: truncated: tensors need {8 + n + header.data_bytes} bytes, the file has {size}"
        )
    return header


def summarize(headers: list[tuple[str, SafetensorsHeader]]) -> WeightsSummary:
    by_dtype: dict[str, int] = {}
    tensors: list[TensorInfo] = []
    for _, h in headers:
        for t in h.tensors:
            by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
            tensors.append(t)
    return WeightsSummary(
        total_bytes=sum(by_dtype.values()),
        bytes_by_dtype=dict(sorted(by_dtype.items())),
        param_count=sum(t.numel for t in tensors),
        tensor_count=len(tensors),
        files=tuple(name for name, _ in headers),
        tensors=tuple(tensors),
    )


def shard_names_from_index(index: Any, *, where: str) -> list[str]:
    """The shard file names an index's `weight_map` points at, in first-seen order."""
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise ConfigError(f"{where}: not a safetensors index (no weight_map object)")
    shards: list[str] = []
    for tensor, shard in index["weight_map"].items():
        if not isinstance(shard, str) or not shard or "/" in shard or "\\" in shard or shard.startswith("."):
            raise ConfigError(f"{where}: tensor {tensor!r} maps to an invalid shard name {shard!r}")
        if shard not in shards:
            shards.append(shard)
    if not shards:
        raise ConfigError(f"{where}: weight_map is empty")
    return shards


def read_index(index_path: str | Path) -> WeightsSummary:
    """Read a sharded checkpoint: every shard named in `model.safetensors.index.json`."""
    from vramlab.infile import read_text

    p = Path(index_path)
    text = read_text(p, "safetensors index", expect="not valid JSON")
    try:
        index = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{p}: not valid JSON ({exc.__class__.__name__})") from None
    shards = shard_names_from_index(index, where=str(p))
    missing = [s for s in shards if not (p.parent / s).is_file()]
    if missing:
        raise ConfigError(f"{p}: shard(s) missing beside the index: {', '.join(missing[:3])}")
    return summarize([(s, read_safetensors_header(p.parent / s)) for s in shards])


def read_directory_weights(directory: str | Path) -> WeightsSummary | None:
    """Weights of a model directory: the index if there is one, else every `*.safetensors`."""
    d = Path(directory)
    if (d / INDEX_NAME).is_file():
        return read_index(d / INDEX_NAME)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        return None
    return summarize([(f.name, read_safetensors_header(f)) for f in files])


def with_weights(spec: ModelSpec, w: WeightsSummary, source: str | None = None) -> ModelSpec:
    """Attach exact weights read from safetensors headers to a spec."""
    return spec.with_(
        weights_bytes_exact=w.total_bytes,
        weights_bytes_by_dtype=dict(w.bytes_by_dtype),
        param_count_exact=w.param_count,
        weights_source="safetensors headers",
        **({"source": source} if source else {}),
    )
