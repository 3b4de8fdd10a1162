"""What the capacity model needs to know about a model: its shape, not its weights.

A `ModelSpec` is built from a catalog entry, a `config.json`, safetensors headers or a GGUF
file (see `vramlab.sources`). Everything here is plain data; the maths lives in
`weights.py` and `kv.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

# Bytes per element of the dtypes that appear in configs, safetensors headers and engine flags.
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "f32": 4,
    "F32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "BF16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "f16": 2,
    "F16": 2,
    "float8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "float8_e4m3fn": 1,
    "int8": 1,
    "I8": 1,
    "U8": 1,
    "uint8": 1,
    "int32": 4,
    "I32": 4,
    "int64": 8,
    "I64": 8,
    "F64": 8,
    "float64": 8,
    "I16": 2,
    "int16": 2,
    "BOOL": 1,
    "fp4": 0.5,
    "nvfp4": 0.5625,
    "F4": 0.5,
}

# Per-layer kinds. "full" = global attention, "sliding" = sliding-window attention,
# "chunked" = chunked local attention (Llama 4), "mamba" = SSM state, "linear" = linear attention
# (gated delta-net and friends; a fixed-size state per sequence like mamba).
# "mlp" = a block with no mixer (Nemotron-H's "-"): in such block-typed models mixers carry no MLP.
LAYER_KINDS = ("full", "sliding", "chunked", "mamba", "linear", "mlp")


def dtype_bytes(name: str) -> float:
    key = name.replace("torch.", "")
    if key in DTYPE_BYTES:
        return DTYPE_BYTES[key]
    if key.lower() in DTYPE_BYTES:
        return DTYPE_BYTES[key.lower()]
    raise KeyError(name)


@dataclass(frozen=True)
class QuantSpec:
    """How the weights are stored.

    `method` is the engine's name for it (awq, gptq, fp8, compressed-tensors, bitsandbytes,
    mxfp4, gguf...). `bits` is the width of the quantized linear weights; embeddings, norms and
    usually the LM head keep `unquantized_dtype`.
    """

    method: str
    bits: float
    group_size: int | None = None  # AWQ/GPTQ group size (-1 or None = per channel)
    has_zeros: bool = True  # AWQ/GPTQ asymmetric zeros
    has_g_idx: bool = False  # GPTQ act-order index
    quantize_lm_head: bool = False
    quantize_embedding: bool = False
    quantize_experts_only: bool = False  # mxfp4 in gpt-oss: only MoE experts are 4-bit
    unquantized_dtype: str = "bfloat16"
    gguf_type: str | None = None  # e.g. Q4_K_M when the figure comes from a GGUF type name
    # bitsandbytes: modules the checkpoint keeps in 16-bit (`llm_int8_skip_modules`, matched as vLLM's
    # `is_layer_skipped_bnb` does) and whether the absmax statistics are themselves quantized
    # (`bnb_4bit_use_double_quant`; vLLM's in-flight quantization always compresses them).
    skip_modules: tuple[str, ...] = ()
    double_quant: bool = False


@dataclass(frozen=True)
class VisionTower:
    """A vision encoder whose memory profile vLLM runs at start-up (`vision_config`): the geometry its
    dummy images and videos go through. Only towers whose profile is modelled get one (see
    capacity/engines/vllm_mm.py); others count in the weights (`vision_params`) and widen the band."""

    family: str  # "qwen2_vl" | "qwen2_5_vl"
    depth: int
    hidden_size: int
    intermediate_size: int
    gated: bool  # SiLU-gated MLP (gate_up + down) rather than fc1 / act / fc2
    out_hidden_size: int  # the language model's width: what each merged token becomes
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    max_pixels: int = (
        12845056  # the image processor's default (preprocessor_config.json of Qwen2-VL / 2.5-VL)
    )


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts that drive memory. Field names follow Hugging Face configs."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int = 0
    max_position_embeddings: int = 0  # 0 = unknown: the user must give a context length
    torch_dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    architecture: str = ""
    model_type: str = ""
    hf_id: str | None = None
    source: str = ""  # where the facts came from (catalog entry's source, a path, a Hub id)

    # RoPE scaling from the config (`rope_scaling`): the context the engine derives from it.
    rope_scaling_type: str | None = None
    rope_scaling_factor: float = 1.0
    rope_original_max_position: int | None = None

    # Attention variants. `layer_kinds` has one entry per layer; None means all "full".
    layer_kinds: tuple[str, ...] | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    v_head_dim: int | None = None  # when V's head size differs from K's
    # Layers of a different attention shape (Gemma-4-like global layers).
    global_num_kv_heads: int | None = None
    global_head_dim: int | None = None

    # MLA (DeepSeek V2/V3, Kimi): a compressed latent is cached instead of K and V.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    mla_v_head_dim: int | None = None

    # MLP and MoE.
    gated_mlp: bool = True  # SwiGLU/GeGLU: gate, up and down projections
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    first_k_dense_layers: int = 0  # DeepSeek first_k_dense_replace
    moe_layer_freq: int = 1  # every n-th layer is MoE (Llama 4 interleave, Qwen decoder_sparse_step)
    moe_layer_offset: int | None = None  # MoE where i % freq == offset (Jamba); None = freq - 1
    attention_bias: bool = False
    mlp_bias: bool = False

    # Mamba / linear-attention state (per layer of that kind).
    mamba_d_state: int = 0
    mamba_d_conv: int = 0
    mamba_expand: int = 0
    mamba_n_heads: int = 0
    mamba_head_dim: int = 0
    mamba_n_groups: int = 1
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    mamba_ssm_dtype: str = (
        ""  # config's recurrent-state dtype (Qwen3.5 `mamba_ssm_dtype`); "" = the engine's default
    )
    # Fraction of head_dim that carries RoPE (`partial_rotary_factor`): the cos/sin cache is that narrow.
    partial_rotary_factor: float = 1.0
    # The MoE router's weight and `e_score_correction_bias` are fp32 whatever the model dtype (GLM-4.5).
    fp32_router: bool = False

    # Speculative decoding (capacity/speculative.py): the multi-token-prediction layers stored after the last
    # layer (`num_nextn_predict_layers`, Qwen3-Next's `mtp_num_hidden_layers`), loaded only as a draft; an EAGLE-3
    # head's own vocabulary (`draft_vocab_size`) and the width of the target it reads (`target_hidden_size`).
    mtp_layers: int = 0
    draft_vocab_size: int = 0
    target_hidden_size: int = 0

    # Multimodal towers: their parameter count is added to the weights.
    vision_params: int = 0
    vision: VisionTower | None = None  # geometry of a tower whose start-up profile is modelled

    quant: QuantSpec | None = None

    # Exact facts from weight files, when read (safetensors headers, GGUF tensor table).
    weights_bytes_exact: int | None = None
    weights_bytes_by_dtype: dict[str, int] | None = field(default=None, compare=False, hash=False)
    param_count_exact: int | None = None
    weights_source: str | None = None  # "safetensors headers", "GGUF tensors"

    def with_(self, **changes: object) -> ModelSpec:
        return replace(self, **changes)  # type: ignore[arg-type]

    # --- derived facts -------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return bool(self.kv_lora_rank)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.layer_kinds if self.layer_kinds is not None else self._all_full

    @cached_property
    def _all_full(self) -> tuple[str, ...]:
        """Built once per spec: callers index kinds per layer, so a fresh tuple each time is quadratic."""
        return ("full",) * self.num_layers

    @property
    def context_length(self) -> int:
        """The context vLLM's current release derives from the config (`_get_and_verify_max_len`); each
        engine's and release's own rule is capacity/defaults.py `derived_context`, which caps at the sliding window
        only when the window is off (vLLM --disable-sliding-window)."""
        from vramlab.capacity.defaults import derived_context

        return derived_context(self, "vllm").tokens

    def count(self, kind: str) -> int:
        return sum(1 for k in self.kinds if k == kind)

    @property
    def attention_layers(self) -> int:
        return sum(1 for k in self.kinds if k in ("full", "sliding", "chunked"))

    @property
    def block_typed(self) -> bool:
        """Each layer is either a mixer or an MLP (Nemotron-H), not both."""
        return "mlp" in self.kinds

    @property
    def is_hybrid(self) -> bool:
        return len(set(self.kinds)) > 1

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    def moe_layer_indices(self) -> list[int]:
        if not self.is_moe:
            return []
        freq = max(1, self.moe_layer_freq)
        offset = freq - 1 if self.moe_layer_offset is None else self.moe_layer_offset
        return [i for i in range(self.num_layers) if i >= self.first_k_dense_layers and i % freq == offset]
