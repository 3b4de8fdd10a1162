"""KV cache bytes per token and per sequence, on one GPU.

- GQA/MHA/MQA: 2 x kv_heads_local x head_dim x dtype per layer, kv_heads_local = max(1, kv // tp)
  (vLLM `get_num_kv_heads`: heads are replicated when TP exceeds them).
- MLA: (kv_lora_rank + qk_rope_head_dim) x dtype per layer, no factor 2 and no TP split;
  `fp8_ds_mla` stores 656 bytes per token per layer (vLLM `MLAAttentionSpec`).
- Mamba / linear attention: a fixed state per sequence (conv + SSM), no per-token growth.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from vramlab.capacity.spec import ModelSpec, dtype_bytes
from vramlab.errors import ConfigError

# vLLM/SGLang spellings, TGI's fp8_e4m3fn, and llama.cpp's --cache-type-k/-v types (ggml block sizes:
# q4_1 = fp16 scale + fp16 min + 16 B, q5_0 = fp16 scale + 4 B high bits + 16 B, q5_1 = q5_0 + fp16 min,
# iq4_nl = fp16 scale + 16 B, per 32 values)
KV_DTYPES = (
    "auto",
    "bfloat16",
    "float16",
    "fp8",
    "fp8_e4m3",
    "fp8_e4m3fn",
    "fp8_e5m2",
    "fp8_ds_mla",
    "int8",
    "fp8_per_token_head",
    "int8_per_token_head",
    "nvfp4",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "iq4_nl",
    "f16",
    "bf16",
    "f32",
    "float32",
)
_GGML_BLOCK_BYTES = {
    "q8_0": 34,
    "q4_0": 18,
    "q4_1": 20,
    "q5_0": 22,
    "q5_1": 24,
    "iq4_nl": 18,
}  # per 32 values
FP8_DS_MLA_BYTES = 656  # 512 fp8 latent + 4 fp32 scales + 64 bf16 rope, per token per layer


def kv_elem_bytes(kv_cache_dtype: str, model_dtype: str) -> float:
    """Bytes per cached element. `auto` follows the model's activation dtype, never the weight format."""
    d = (kv_cache_dtype or "auto").lower()
    if d == "auto":
        return dtype_bytes(model_dtype)
    if d in _GGML_BLOCK_BYTES:
        return _GGML_BLOCK_BYTES[d] / 32
    if d in (
        "fp8",
        "fp8_e4m3",
        "fp8_e4m3fn",
        "fp8_e5m2",
        "int8",
        "fp8_per_token_head",
        "int8_per_token_head",
        "fp8_ds_mla",
    ):
        return 1.0
    if d == "nvfp4":
        return 0.5 + 1 / 16  # packed fp4 + one fp8 scale per 16
    if d in ("bfloat16", "float16", "bf16", "fp16", "f16", "half"):
        return 2.0
    if d in ("float32", "f32", "fp32"):
        return 4.0
    raise ConfigError(f"unknown --kv-cache-dtype {kv_cache_dtype!r}; expected one of {', '.join(KV_DTYPES)}")


@dataclass(frozen=True)
class KVShape:
    """Per-GPU KV facts for one layer kind."""

    kind: str
    layers: int  # layers of this kind on this GPU
    bytes_per_token_layer: int  # one token, one layer, this GPU


def kv_heads_local(total_kv_heads: int, tp: int) -> int:
    return max(1, total_kv_heads // tp)


def bytes_per_token_layer(m: ModelSpec, kind: str, kv_cache_dtype: str, model_dtype: str, tp: int) -> int:
    """KV bytes one token adds in one attention layer of *kind* on one GPU."""
    if kind in ("mamba", "linear", "mlp"):
        return 0
    if m.is_mla:
        if (kv_cache_dtype or "").lower() == "fp8_ds_mla":
            return FP8_DS_MLA_BYTES
        latent = (m.kv_lora_rank or 512) + (m.qk_rope_head_dim or 64)
        return int(latent * kv_elem_bytes(kv_cache_dtype, model_dtype))
    heads, hd = m.num_kv_heads, m.head_dim
    vd = m.value_head_dim
    if kind == "full" and m.global_num_kv_heads:
        heads = m.global_num_kv_heads
        hd = vd = m.global_head_dim or hd
    local = kv_heads_local(heads, tp)
    per = local * (hd + vd) * kv_elem_bytes(kv_cache_dtype, model_dtype)
    if (kv_cache_dtype or "").endswith("_per_token_head"):
        per += 2 * local * 4  # fp32 scale per token per head for K and V
    return int(per)


@lru_cache(maxsize=512)
def kv_shapes(
    m: ModelSpec, kv_cache_dtype: str, model_dtype: str, tp: int, layer_range: range
) -> tuple[KVShape, ...]:
    """Attention layer groups on one GPU (for the layers of one pipeline stage)."""
    counts: dict[str, int] = {}
    kinds = m.kinds
    for i in layer_range:
        k = kinds[i] if i < len(kinds) else "full"
        if k in ("mamba", "linear", "mlp"):
            continue
        counts[k] = counts.get(k, 0) + 1
    return tuple(
        KVShape(k, n, bytes_per_token_layer(m, k, kv_cache_dtype, model_dtype, tp)) for k, n in counts.items()
    )


@lru_cache(maxsize=512)
def state_bytes_per_sequence(
    m: ModelSpec, model_dtype: str, tp: int, layer_range: range, recurrent_dtype: str = "float32"
) -> int:
    """Mamba-2 / gated-delta-net state one sequence holds on one GPU (conv + SSM/recurrent); the
    gated-delta-net recurrent state in `recurrent_dtype` (the engine decides it)."""
    kinds = m.kinds
    n_mamba = sum(1 for i in layer_range if i < len(kinds) and kinds[i] == "mamba")
    n_linear = sum(1 for i in layer_range if i < len(kinds) and kinds[i] == "linear")
    if not (n_mamba or n_linear):
        return 0
    b = dtype_bytes(model_dtype)
    total = 0.0
    if n_mamba:
        inner = (m.mamba_n_heads * m.mamba_head_dim) or m.mamba_expand * m.hidden_size
        d_state = m.mamba_d_state or 128
        conv_dim = inner + 2 * m.mamba_n_groups * d_state
        conv = conv_dim * max(1, m.mamba_d_conv - 1) * b
        heads = m.mamba_n_heads or max(1, inner // 64)
        head_dim = m.mamba_head_dim or inner // heads
        ssm = heads * head_dim * d_state * b
        total += n_mamba * (conv + ssm) / tp
    if n_linear:
        k = m.linear_num_key_heads * m.linear_key_head_dim
        v = m.linear_num_value_heads * m.linear_value_head_dim
        conv = (2 * k + v) * max(1, m.linear_conv_kernel_dim - 1) * b
        rec = (
            m.linear_num_value_heads
            * m.linear_key_head_dim
            * m.linear_value_head_dim
            * dtype_bytes(recurrent_dtype)
        )
        total += n_linear * (conv + rec) / tp
    return int(total)


def kv_bytes_per_token(
    m: ModelSpec, kv_cache_dtype: str, model_dtype: str, tp: int, layer_range: range | None = None
) -> int:
    """All local layers' KV bytes for one token held at full length (the naive per-token cost)."""
    rng = layer_range if layer_range is not None else range(m.num_layers)
    return sum(s.layers * s.bytes_per_token_layer for s in kv_shapes(m, kv_cache_dtype, model_dtype, tp, rng))
