"""Turn a Hugging Face `config.json` dict into a `ModelSpec`.

Handles the shapes that trip estimators up (docs/research/capacity-anchors.md §5 and the
llm-d-planner anchor): explicit `head_dim` (Qwen3, Gemma), `text_config` of vision-language
models (MLA hiding inside Kimi-VL's text config), layer patterns of sliding-window models,
MoE field spellings, MLA, Mamba/linear-attention hybrids and `quantization_config`.
"""

from __future__ import annotations

from typing import Any

from vramlab.capacity.spec import ModelSpec, VisionTower
from vramlab.capacity.validation import check_config_flags, check_config_numbers
from vramlab.errors import ConfigError
from vramlab.sources.config_checks import check_heads, check_quant_config, mlp_width
from vramlab.sources.hf_quant import quant_spec

# torch's dtype names a config.json may carry ("auto" too); anything else is a broken config.
TORCH_DTYPE_NAMES = frozenset(
    {
        "auto",
        "bfloat16",
        "float16",
        "half",
        "float32",
        "float",
        "float64",
        "double",
        "float8_e4m3fn",
        "float8_e5m2",
        "int8",
        "uint8",
    }
)

# Families whose `sliding_window` applies to every layer when no per-layer pattern is given.
_ALL_LAYERS_SLIDING = {"mistral", "starcoder2", "mixtral"}
# Families where the field exists but is off unless `use_sliding_window` is true.
_OPT_IN_SLIDING = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl"}
# MLP without a gate projection (two matrices instead of three).
_UNGATED = {"phi", "phi-msft", "gpt2", "gpt_bigcode", "starcoder2", "falcon", "gpt_neox", "opt", "bloom"}

_LAYER_TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "global": "full",
    "full": "full",
    "sliding_attention": "sliding",
    "sliding": "sliding",
    "local": "sliding",
    "chunked_attention": "chunked",
    "mamba": "mamba",
    "mamba2": "mamba",
    "ssm": "mamba",
    "linear_attention": "linear",
    "linear": "linear",
}


# Vision towers that load with the language model, for configs that describe only the text part
# (hidden, layers, MLP width, gated): the published encoders of these architectures.
_DEFAULT_VISION = {
    "Gemma3ForConditionalGeneration": {
        "hidden_size": 1152,
        "num_hidden_layers": 27,
        "intermediate_size": 4304,
    },
    "PixtralForConditionalGeneration": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "intermediate_size": 4096,
        "hidden_act": "silu",
    },
    "Mistral3ForConditionalGeneration": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "intermediate_size": 4096,
        "hidden_act": "silu",
    },
    "Llama4ForConditionalGeneration": {
        "hidden_size": 1408,
        "num_hidden_layers": 34,
        "intermediate_size": 5632,
    },
    "Qwen2_5_VLForConditionalGeneration": {
        "hidden_size": 1280,
        "num_hidden_layers": 32,
        "intermediate_size": 3420,
        "hidden_act": "silu",
        "spatial_merge_size": 2,
    },
}


def _merged(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: `text_config` (or `llm_config`) over the top level."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, dict) and sub:
            merged = {k: v for k, v in config.items() if k != key}
            merged.update({k: v for k, v in sub.items() if v is not None})
            merged.setdefault("_vision", config.get("vision_config"))
            if "architectures" in config:
                merged["architectures"] = config["architectures"]
            if "quantization_config" in config and "quantization_config" not in sub:
                merged["quantization_config"] = config["quantization_config"]
            return merged
    out = dict(config)
    out.setdefault("_vision", config.get("vision_config"))
    return out


def _first(c: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        v = c.get(k)
        if v is not None:
            return v
    return default


def _need(c: dict[str, Any], name: str, *keys: str) -> int:
    v = _first(c, *keys)
    if v is None:
        raise ConfigError(f"{name}: config is missing {keys[0]!r} (needed for the capacity model)")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: config field {keys[0]!r} is not a number: {v!r}") from None


def _layer_kinds(c: dict[str, Any], n: int, model_type: str) -> tuple[str, ...] | None:
    types = c.get("layer_types")
    if isinstance(types, list) and types:
        kinds = tuple(_LAYER_TYPE_NAMES.get(str(t).lower(), "full") for t in types)
        return kinds[:n] if len(kinds) >= n else kinds + ("full",) * (n - len(kinds))
    summary = c.get("layer_types_summary")
    if isinstance(summary, dict) and summary:
        n_sliding = int(summary.get("sliding_attention", 0))
        n_linear = int(summary.get("linear_attention", 0))
        if n_sliding and n_sliding * 2 == n:  # alternating, sliding first (gpt-oss)
            return tuple("sliding" if i % 2 == 0 else "full" for i in range(n))
        listed = ["full"] * n
        for i in range(min(n_sliding + n_linear, n)):
            listed[i] = "sliding" if i < n_sliding else "linear"
        return tuple(listed)
    pattern = c.get("hybrid_override_pattern")  # Nemotron-H: M = mamba, * = attention, - = MLP
    if isinstance(pattern, str) and pattern:
        block = {"M": "mamba", "*": "full", "-": "mlp", "E": "mlp"}
        return tuple(block[ch] for ch in pattern if ch in block)
    interval = c.get("full_attention_interval")  # Qwen3-Next: every n-th layer full, the rest gated delta-net
    if isinstance(interval, int) and interval > 0 and model_type.startswith("qwen3_next"):
        return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(n))
    if model_type == "jamba" and c.get("attn_layer_period"):
        period, offset = int(c["attn_layer_period"]), int(c.get("attn_layer_offset", 0))
        return tuple("full" if i % period == offset else "mamba" for i in range(n))
    window = c.get("sliding_window")
    if model_type == "gemma2" and window:
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(n))
    swp = c.get("sliding_window_pattern") or c.get("_sliding_window_pattern")
    if window and isinstance(swp, int) and swp > 1:  # Gemma 3, Cohere2: every swp-th layer is global
        return tuple("full" if (i + 1) % swp == 0 else "sliding" for i in range(n))
    chunk = c.get("attention_chunk_size")
    if chunk:  # Llama 4: NoPE layers (every 4th) are global, the rest chunked local
        nope = c.get("no_rope_layers")
        if isinstance(nope, list) and len(nope) >= n:
            return tuple("chunked" if nope[i] else "full" for i in range(n))
        interval = int(c.get("nope_layer_interval") or 4)
        return tuple("full" if (i + 1) % interval == 0 else "chunked" for i in range(n))
    if window and (
        model_type in _ALL_LAYERS_SLIDING or (model_type in _OPT_IN_SLIDING and c.get("use_sliding_window"))
    ):
        return ("sliding",) * n
    return None


def _rotary_fraction(c: dict[str, Any], model_type: str) -> float:
    """`partial_rotary_factor` (top level or in `rope_parameters`). vLLM's Glm4MoeAttention defaults it
    to 0.5 when the config is silent (vllm/model_executor/models/glm4_moe.py,
    `rope_parameters.setdefault("partial_rotary_factor", 0.5)`)."""
    rp = c.get("rope_parameters")
    value = c.get("partial_rotary_factor") or (
        rp.get("partial_rotary_factor") if isinstance(rp, dict) else None
    )
    if value is None:
        return 0.5 if model_type == "glm4_moe" else 1.0
    return min(1.0, max(0.0, float(value)))


def spec_from_config(config: dict[str, Any], name: str, source: str, hf_id: str | None = None) -> ModelSpec:
    """A `ModelSpec` from a config.json dict; a missing essential field raises ConfigError naming it.

    config.json is outside input: a field of a shape no real config has (a list where a number
    goes, a string for a mapping) that the named checks did not catch is still bad input, said in
    one line, never an internal error (tests/test_fuzz.py mutates real configs to find them)."""
    if not isinstance(config, dict):
        raise ConfigError(f"{name}: config is not a JSON object")
    try:
        return _with_draft_facts(_spec_from_config(config, name, source, hf_id), _merged(config))
    except (
        TypeError,
        ValueError,
        KeyError,
        AttributeError,
        IndexError,
        OverflowError,
        ZeroDivisionError,
    ) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"{name}: config.json has a field of the wrong type or value "
            f"({type(exc).__name__}: {str(exc)[:160]})"
        ) from None


def _with_draft_facts(spec: ModelSpec, c: dict[str, Any]) -> ModelSpec:
    """What speculative decoding reads (capacity/speculative.py): the MTP layers stored after the last layer
    (`num_nextn_predict_layers`: DeepSeek-V3, GLM-4.5, MiMo; `mtp_num_hidden_layers`: Qwen3-Next, Qwen3.5) and an
    EAGLE-3 head's own vocabulary and the hidden width of the target it reads."""
    mtp = _first(c, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0) or 0
    draft_vocab = c.get("draft_vocab_size") or 0
    target_hidden = c.get("target_hidden_size") or 0
    for key, value in (
        ("num_nextn_predict_layers", mtp),
        ("draft_vocab_size", draft_vocab),
        ("target_hidden_size", target_hidden),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 24:
            raise ConfigError(f"{spec.name}: config field {key!r} must be a whole number >= 0, got {value!r}")
    if not (mtp or draft_vocab or target_hidden):
        return spec
    return spec.with_(mtp_layers=mtp, draft_vocab_size=draft_vocab, target_hidden_size=target_hidden)


def _spec_from_config(config: dict[str, Any], name: str, source: str, hf_id: str | None) -> ModelSpec:
    c = _merged(config)
    check_config_numbers(c, name)
    check_config_flags(config, name)  # a multimodal config's top level too (text_config wins in c)
    check_quant_config(c, name)
    archs = c.get("architectures") or [""]
    arch = str(archs[0]) if isinstance(archs, list) and archs else str(archs)
    model_type = str(c.get("model_type") or "").lower() or arch.lower().replace("forcausallm", "")

    hidden = _need(c, name, "hidden_size", "d_model", "n_embd", "dim")
    layers = _need(c, name, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    if isinstance(c.get("hybrid_override_pattern"), str):  # Nemotron-H: one block per character
        layers = len(c["hybrid_override_pattern"])
    heads = _first(c, "num_attention_heads", "n_head", "n_heads")
    head_dim = _first(c, "head_dim", "attention_head_size")
    kv = _first(c, "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
    if heads is None and c.get("q_proj_out_features"):  # a module print, not a config
        head_dim = int(head_dim or 128)
        heads = int(c["q_proj_out_features"]) // head_dim
        kv = int(c.get("k_proj_out_features", heads * head_dim)) // head_dim
    if heads is None:
        raise ConfigError(f"{name}: config is missing 'num_attention_heads' (needed for the capacity model)")
    heads = int(heads)
    if kv is None:
        kv = 1 if c.get("multi_query") else heads
    check_heads(name, heads, kv)
    head_dim = int(head_dim) if head_dim else hidden // heads
    vocab = _need(c, name, "vocab_size", "padded_vocab_size", "n_vocab")
    torch_dtype = str(_first(c, "torch_dtype", "dtype", default="bfloat16")).replace("torch.", "")
    if torch_dtype not in TORCH_DTYPE_NAMES:  # transformers refuses it too: not "planned as bf16"
        raise ConfigError(
            f"{name}: config.json torch_dtype {torch_dtype!r} is not a torch dtype "
            f"(expected one of {', '.join(sorted(TORCH_DTYPE_NAMES))})"
        )
    if torch_dtype not in ("bfloat16", "float16", "float32"):
        torch_dtype = "bfloat16"

    inter = mlp_width(c, name, model_type, hidden)
    kinds = _layer_kinds(c, layers, model_type)

    n_experts = int(
        _first(c, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", default=0) or 0
    )
    moe_inter = int(_first(c, "moe_intermediate_size", default=0) or 0)
    if n_experts and not moe_inter:
        moe_inter = int(c.get("intermediate_size") or inter)
    if model_type.startswith("llama4") and n_experts:
        moe_inter = int(c.get("intermediate_size") or moe_inter)
        inter = int(c.get("intermediate_size_mlp") or 2 * moe_inter)
        c = {
            **c,
            "n_shared_experts": c.get("n_shared_experts") or 1,
        }  # every Llama 4 MoE layer has one shared expert
    shared_inter = int(c.get("shared_expert_intermediate_size") or 0)
    n_shared = int(_first(c, "n_shared_experts", "num_shared_experts", default=0) or 0)
    if shared_inter and not n_shared:
        n_shared = 1
    elif n_shared and not shared_inter:
        shared_inter = (
            moe_inter * n_shared if model_type.startswith("deepseek") or "kimi" in model_type else moe_inter
        )
        if model_type.startswith("deepseek") or "kimi" in model_type:
            n_shared = 1
    first_dense = int(_first(c, "first_k_dense_replace", default=0) or 0)
    freq = int(
        _first(
            c,
            "interleave_moe_layer_step",
            "decoder_sparse_step",
            "moe_layer_freq",
            "expert_layer_period",
            default=1,
        )
        or 1
    )
    offset = c.get("expert_layer_offset")  # Jamba: MoE where i % period == offset

    vision = c.get("_vision") or _DEFAULT_VISION.get(arch)
    text_hidden = int(c.get("hidden_size") or 0)
    vision_params = _vision_params(vision, text_hidden) if isinstance(vision, dict) else 0
    if not vision_params and c.get("vision_depth") and c.get("vision_hidden_size"):
        vision_params = _vision_params(
            {
                "depth": c["vision_depth"],
                "hidden_size": c["vision_hidden_size"],
                "intermediate_size": c.get("vision_intermediate_size"),
                "out_hidden_size": c.get("vision_out_hidden_size"),
            },
            text_hidden,
        )

    tower = _vision_tower(
        arch,
        vision
        if isinstance(vision, dict)
        else {
            "depth": c.get("vision_depth"),
            "hidden_size": c.get("vision_hidden_size"),
            "intermediate_size": c.get("vision_intermediate_size"),
            "out_hidden_size": c.get("vision_out_hidden_size"),
        },
        text_hidden,
    )

    mamba_heads = int(_first(c, "mamba_n_heads", "mamba_num_heads", default=0) or 0)
    rope_field = c.get("rope_scaling")
    rope: dict[str, Any] = rope_field if isinstance(rope_field, dict) else {}
    rope_type = rope.get("rope_type") or rope.get("type")
    spec = ModelSpec(
        name=name,
        hf_id=hf_id,
        source=source,
        architecture=arch,
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_kv_heads=int(kv),
        head_dim=head_dim,
        v_head_dim=None,
        vocab_size=vocab,
        max_position_embeddings=int(
            _first(
                c, "max_position_embeddings", "n_positions", "seq_length", "max_sequence_length", default=0
            )
        ),
        torch_dtype=torch_dtype,
        rope_scaling_type=str(rope_type) if rope_type else None,
        rope_scaling_factor=float(rope.get("factor") or 1.0) if rope_type else 1.0,
        rope_original_max_position=int(rope["original_max_position_embeddings"])
        if rope.get("original_max_position_embeddings")
        else None,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", model_type.startswith("gemma"))),
        layer_kinds=kinds,
        sliding_window=int(c["sliding_window"])
        if c.get("sliding_window") and kinds and "sliding" in kinds
        else None,
        attention_chunk_size=int(c["attention_chunk_size"]) if c.get("attention_chunk_size") else None,
        global_num_kv_heads=c.get("num_global_key_value_heads"),
        global_head_dim=c.get("global_head_dim"),
        kv_lora_rank=c.get("kv_lora_rank"),
        q_lora_rank=c.get("q_lora_rank"),
        qk_rope_head_dim=c.get("qk_rope_head_dim"),
        qk_nope_head_dim=c.get("qk_nope_head_dim"),
        mla_v_head_dim=c.get("v_head_dim") if c.get("kv_lora_rank") else None,
        gated_mlp=model_type not in _UNGATED,
        num_experts=n_experts,
        num_experts_per_tok=int(
            _first(c, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0) or 0
        ),
        moe_intermediate_size=moe_inter,
        num_shared_experts=n_shared,
        shared_expert_intermediate_size=shared_inter,
        first_k_dense_layers=first_dense,
        moe_layer_freq=freq,
        moe_layer_offset=int(offset) if offset is not None else None,
        attention_bias=bool(
            c.get("attention_bias", model_type in ("qwen2", "qwen2_moe", "qwen2_5_vl", "phi"))
        ),
        mamba_d_state=int(_first(c, "mamba_d_state", "ssm_state_size", "state_size", default=0) or 0),
        mamba_d_conv=int(_first(c, "mamba_d_conv", "conv_kernel", default=4) or 4),
        mamba_expand=int(_first(c, "mamba_expand", "expand", default=2) or 2),
        mamba_n_heads=mamba_heads,
        mamba_head_dim=int(_first(c, "mamba_d_head", "mamba_head_dim", default=0) or 0),
        mamba_n_groups=int(_first(c, "mamba_n_groups", "n_groups", default=1) or 1),
        linear_num_key_heads=int(c.get("linear_num_key_heads") or 0),
        linear_num_value_heads=int(c.get("linear_num_value_heads") or 0),
        linear_key_head_dim=int(c.get("linear_key_head_dim") or 0),
        linear_value_head_dim=int(c.get("linear_value_head_dim") or 0),
        linear_conv_kernel_dim=int(c.get("linear_conv_kernel_dim") or 4),
        mamba_ssm_dtype=str(c.get("mamba_ssm_dtype") or ""),
        partial_rotary_factor=_rotary_fraction(c, model_type),
        fp32_router=model_type == "glm4_moe" and n_experts > 0,
        vision_params=vision_params,
        vision=tower if vision_params else None,
        quant=quant_spec(c, torch_dtype),
    )
    if spec.num_kv_heads <= 0 or spec.num_attention_heads <= 0 or spec.head_dim <= 0:
        raise ConfigError(f"{name}: attention heads and head_dim must be positive")
    return spec


# Towers whose start-up profile vLLM runs and vramlab models (capacity/engines/vllm_mm.py): the Qwen2-VL
# family's `vision_config`. Qwen2-VL names the tower width `embed_dim` (MLP `mlp_ratio` x wide, QuickGELU);
# Qwen2.5-VL `hidden_size` with a SiLU-gated `intermediate_size` MLP and `out_hidden_size` for the LM.
_PROFILED_TOWERS = {
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
}


def _vision_tower(arch: str, v: dict[str, Any], text_hidden: int) -> VisionTower | None:
    family = _PROFILED_TOWERS.get(arch)
    if family is None:
        return None
    if family == "qwen2_vl":
        hidden = int(v.get("embed_dim") or 0)
        inter = int(hidden * float(v.get("mlp_ratio") or 4))
        out = int(v.get("hidden_size") or text_hidden)
    else:
        hidden = int(v.get("hidden_size") or 0)
        inter = int(v.get("intermediate_size") or 0)
        out = int(v.get("out_hidden_size") or text_hidden)
    depth = int(v.get("depth") or v.get("num_hidden_layers") or 0)
    if not (hidden and inter and depth and out):
        return None
    return VisionTower(
        family=family,
        depth=depth,
        hidden_size=hidden,
        intermediate_size=inter,
        gated=family == "qwen2_5_vl",
        out_hidden_size=out,
        patch_size=int(v.get("patch_size") or 14),
        temporal_patch_size=int(v.get("temporal_patch_size") or 2),
        spatial_merge_size=int(v.get("spatial_merge_size") or 2),
        in_channels=int(v.get("in_chans") or v.get("in_channels") or 3),
    )


def _vision_params(v: dict[str, Any], text_hidden: int = 0) -> int:
    """A ViT tower's parameters: ~ (4 + 2 x mlp_ratio) x hidden^2 per block (qkv, out, MLP), plus the
    patch merger of Qwen2-VL-style towers (`spatial_merge_size`): a 2-layer MLP from hidden x merge^2 to
    hidden x merge^2 to the language model's width (transformers/vLLM `PatchMerger`; Qwen2.5-VL-7B:
    5120^2 + 5120 x 3584 = 44.6M), one more per deepstack layer (Qwen3-VL `deepstack_visual_indexes`).
    Qwen2-VL names the tower width `embed_dim` and the language model's `hidden_size`."""
    hidden = int(_first(v, "embed_dim", "hidden_size", "width", default=0) or 0)
    depth = int(_first(v, "num_hidden_layers", "depth", "layers", default=0) or 0)
    if not hidden or not depth:
        return 0
    inter = int(_first(v, "intermediate_size", default=4 * hidden) or 4 * hidden)
    per_block = 4 * hidden * hidden + 2 * hidden * inter
    if v.get("hidden_act") in ("silu", "swiglu") or str(v.get("model_type") or "").startswith("qwen2_5"):
        per_block += hidden * inter  # gated MLP
    merger = 0
    merge = v.get("spatial_merge_size")
    if merge:
        wide = hidden * int(merge) ** 2
        out = int(
            v.get("out_hidden_size") or (v.get("hidden_size") if v.get("embed_dim") else 0) or text_hidden
        )
        deepstack = v.get("deepstack_visual_indexes")
        merger = (wide * wide + wide * out) * (1 + (len(deepstack) if isinstance(deepstack, list) else 0))
    return depth * per_block + merger
