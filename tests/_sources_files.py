"""Builders for real model files in tmp dirs: safetensors shards, model directories, GGUFs."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

BITS = {"F32": 32, "F16": 16, "BF16": 16, "I32": 32, "U8": 8, "I8": 8, "F8_E4M3": 8, "I64": 64}


def safetensors_bytes(
    tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None, fill: int = 0
) -> bytes:
    """A complete safetensors file: header, then each tensor's data (every byte = *fill*)."""
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = math.prod(shape) * BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    if metadata is not None:
        header["__metadata__"] = metadata
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)  # the reference writer pads the header to 8 bytes
    return struct.pack("<Q", len(blob)) + blob + bytes([fill]) * offset


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], **kw: object) -> int:
    """Write a file; returns its tensor data size in bytes."""
    data = safetensors_bytes(tensors, **kw)  # type: ignore[arg-type]
    path.write_bytes(data)
    n = struct.unpack("<Q", data[:8])[0]
    return len(data) - 8 - n


TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def tiny_llama_tensors(
    layers: range, dtype: str = "BF16", with_embed: bool = True, with_head: bool = True
) -> dict[str, tuple[str, list[int]]]:
    """The tensors of TINY_LLAMA_CONFIG's layers (names and shapes as a Llama checkpoint has them)."""
    t: dict[str, tuple[str, list[int]]] = {}
    if with_embed:
        t["model.embed_tokens.weight"] = (dtype, [256, 64])
    for i in layers:
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = (dtype, [64, 64])
        t[p + "self_attn.k_proj.weight"] = (dtype, [32, 64])
        t[p + "self_attn.v_proj.weight"] = (dtype, [32, 64])
        t[p + "self_attn.o_proj.weight"] = (dtype, [64, 64])
        t[p + "mlp.gate_proj.weight"] = (dtype, [128, 64])
        t[p + "mlp.up_proj.weight"] = (dtype, [128, 64])
        t[p + "mlp.down_proj.weight"] = (dtype, [64, 128])
        t[p + "input_layernorm.weight"] = (dtype, [64])
        t[p + "post_attention_layernorm.weight"] = (dtype, [64])
    if with_head:
        t["model.norm.weight"] = (dtype, [64])
        t["lm_head.weight"] = (dtype, [256, 64])
    return t


def write_sharded_model(d: Path, config: dict | None = None) -> dict[str, bytes]:
    """A two-shard model directory; returns {file name: bytes} of everything written."""
    d.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {"config.json": json.dumps(config or TINY_LLAMA_CONFIG).encode()}
    shard1 = tiny_llama_tensors(range(0, 1), with_head=False)
    shard2 = tiny_llama_tensors(range(1, 2), with_embed=False)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    files[names[0]] = safetensors_bytes(shard1, {"format": "pt"}, fill=1)
    files[names[1]] = safetensors_bytes(shard2, {"format": "pt"}, fill=2)
    weight_map = {k: names[0] for k in shard1} | {k: names[1] for k in shard2}
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}
    ).encode()
    for name, data in files.items():
        (d / name).write_bytes(data)
    return files


def tiny_llama_bytes(dtype_bits: int = 16) -> int:
    """Bytes of every tensor of the two-layer tiny Llama (independent count from the shapes)."""
    per_layer = 64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3 + 64 * 2
    return (256 * 64 * 2 + 2 * per_layer + 64) * dtype_bits // 8


def write_gguf(
    path: Path,
    arch: str = "llama",
    *,
    layers: int = 2,
    kv: int | list[int] = 2,
    extra: dict[str, object] | None = None,
    quant_type: str = "Q8_0",
    tie: bool = True,
) -> None:
    """A small but complete GGUF: metadata plus embedding, per-layer weights and norms."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
    from gguf.constants import GGML_QUANT_SIZES

    q = GGMLQuantizationType[quant_type]
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny-" + arch)
    w.add_block_count(layers)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(kv)
    w.add_key_length(64)
    w.add_value_length(64)
    w.add_context_length(4096)
    w.add_vocab_size(512)
    w.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    for key, value in (extra or {}).items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("token_embd.weight", np.zeros((512, 256), dtype=np.float16))
    block, type_size = GGML_QUANT_SIZES[q]
    for i in range(layers):
        # Quantized matrices are given as raw bytes: rows x (cols / block x type_size).
        w.add_tensor(
            f"blk.{i}.attn_q.weight", np.zeros((256, 256 // block * type_size), dtype=np.uint8), raw_dtype=q
        )
        w.add_tensor(
            f"blk.{i}.ffn_up.weight", np.zeros((512, 256 // block * type_size), dtype=np.uint8), raw_dtype=q
        )
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(256, dtype=np.float32))
    if not tie:
        w.add_tensor("output.weight", np.zeros((512, 256), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
