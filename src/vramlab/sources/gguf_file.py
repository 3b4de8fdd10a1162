"""Model facts from a GGUF file: architecture metadata and the exact bytes of every tensor.

The `gguf` package (imported only here, only when a GGUF is read) memory-maps the file and parses
its key/value metadata and tensor table; tensor data is never touched. The metadata keys
(`{arch}.block_count`, `{arch}.attention.head_count_kv`...) are mapped to the Hugging Face config
names so that one parser (`hf_config.spec_from_config`) decides layer patterns and MoE/MLA shapes
for every source; the GGUF's own tensor table then gives the exact weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlab.capacity.spec import ModelSpec, QuantSpec
from vramlab.errors import ConfigError

# GGUF `general.architecture` -> Hugging Face `model_type`, where the two differ.
_MODEL_TYPE = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "qwen3next": "qwen3_next",
    "gemma3": "gemma3_text",
    "deepseek2": "deepseek_v2",
    "gpt-oss": "gpt_oss",
    "granitehybrid": "granitemoehybrid",
    "command-r": "cohere",
}
# Types whose tensors are norms/biases kept in float: not "the" quantization of a file.
_FLOAT_TYPES = {"F32", "F64", "F16", "BF16"}


@dataclass(frozen=True)
class GGUFFacts:
    """What a GGUF says, before it becomes a ModelSpec."""

    architecture: str
    metadata: dict[str, Any] = field(compare=False, hash=False)
    tensor_bytes_by_type: dict[str, int] = field(compare=False, hash=False)
    tensor_elements_by_type: dict[str, int] = field(compare=False, hash=False)
    tensor_shapes: dict[str, tuple[int, ...]] = field(compare=False, hash=False)
    file_type: str | None = None  # e.g. MOSTLY_Q4_K_M from general.file_type

    @property
    def total_bytes(self) -> int:
        return sum(self.tensor_bytes_by_type.values())

    @property
    def param_count(self) -> int:
        return sum(self.tensor_elements_by_type.values())

    @property
    def dominant_type(self) -> str:
        """The quantized type holding the most elements (norms in F32 don't count)."""
        pool = {t: n for t, n in self.tensor_elements_by_type.items() if t not in _FLOAT_TYPES}
        pool = pool or self.tensor_elements_by_type
        return max(pool, key=lambda t: pool[t]) if pool else "F32"

    def get(self, key: str, default: Any = None) -> Any:
        """A `{arch}.`-relative metadata value (`block_count`, `attention.head_count`...)."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def _field_value(fld: Any) -> Any:
    """A metadata value as plain Python; long arrays (token lists) are summarised by length."""
    from gguf import GGUFValueType

    if not fld.types:
        return None
    if fld.types[0] == GGUFValueType.ARRAY:
        if len(fld.data) > 4096:  # vocabularies, merges: only their length matters here
            return {"array_length": len(fld.data)}
        return fld.contents()
    return fld.contents()


def read_gguf_facts(path: str | Path) -> GGUFFacts:
    """Parse metadata and the tensor table. Any malformed file raises ConfigError."""
    from vramlab.infile import check_input

    p = Path(path)
    check_input(p, "GGUF")  # a regular file: GGUFReader maps it into memory
    try:
        from gguf import GGUFReader, LlamaFileType
    except ImportError:  # pragma: no cover - gguf is a declared dependency
        raise ConfigError("reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    try:
        reader = GGUFReader(str(p), "r")
        metadata = {name: _field_value(fld) for name, fld in reader.fields.items()}
        by_type_bytes: dict[str, int] = {}
        by_type_elems: dict[str, int] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        for t in reader.tensors:
            tname = t.tensor_type.name
            by_type_bytes[tname] = by_type_bytes.get(tname, 0) + int(t.n_bytes)
            by_type_elems[tname] = by_type_elems.get(tname, 0) + int(t.n_elements)
            shapes[t.name] = tuple(int(d) for d in t.shape)
    except ConfigError:
        raise
    except Exception as exc:  # the gguf package raises whatever numpy/struct raise on junk
        raise ConfigError(f"{p}: not a readable GGUF file ({exc.__class__.__name__}: {exc})") from None
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ConfigError(f"{p}: GGUF has no general.architecture")
    file_type = None
    ft = metadata.get("general.file_type")
    if isinstance(ft, int):
        try:
            file_type = LlamaFileType(ft).name
        except ValueError:
            file_type = str(ft)
    return GGUFFacts(arch, metadata, by_type_bytes, by_type_elems, shapes, file_type)


def _scalar_or_max(v: Any) -> int | None:
    """Per-layer arrays (head_count_kv of hybrids, feed_forward_length of some MoEs) -> the max."""
    if isinstance(v, list):
        vals = [int(x) for x in v if isinstance(x, (int, float))]
        return max(vals) if vals else None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return int(v)
    return None


def config_from_gguf(f: GGUFFacts, where: str) -> dict[str, Any]:
    """The GGUF metadata as a Hugging Face-style config dict."""
    arch = f.architecture
    layers = _scalar_or_max(f.get("block_count"))
    hidden = _scalar_or_max(f.get("embedding_length"))
    heads = _scalar_or_max(f.get("attention.head_count"))
    missing = [
        k
        for k, v in (("block_count", layers), ("embedding_length", hidden), ("attention.head_count", heads))
        if not v
    ]
    if missing:
        raise ConfigError(f"{where}: GGUF metadata lacks {', '.join(f'{arch}.{k}' for k in missing)}")
    assert layers and hidden and heads
    cfg: dict[str, Any] = {
        "architectures": [f"gguf:{arch}"],
        "model_type": _MODEL_TYPE.get(arch, arch),
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "torch_dtype": "float16",  # llama.cpp computes and caches K/V in f16 by default
    }
    kv_raw = f.get("attention.head_count_kv")
    cfg["num_key_value_heads"] = _scalar_or_max(kv_raw) or heads
    key_len = _scalar_or_max(f.get("attention.key_length"))
    cfg["head_dim"] = key_len or hidden // heads
    ff = _scalar_or_max(f.get("feed_forward_length"))
    if ff:
        cfg["intermediate_size"] = ff
    embd = f.tensor_shapes.get("token_embd.weight")
    vocab = _scalar_or_max(f.get("vocab_size")) or (max(embd) if embd else None)
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if not vocab and isinstance(tokens, (list, dict)):
        vocab = tokens["array_length"] if isinstance(tokens, dict) else len(tokens)
    if not vocab:
        raise ConfigError(
            f"{where}: GGUF gives no vocabulary size (no {arch}.vocab_size, token_embd or tokens)"
        )
    cfg["vocab_size"] = vocab
    cfg["tie_word_embeddings"] = "output.weight" not in f.tensor_shapes
    ctx = _scalar_or_max(f.get("context_length"))
    if ctx:
        cfg["max_position_embeddings"] = ctx

    window = _scalar_or_max(f.get("attention.sliding_window"))
    pattern = f.get("attention.sliding_window_pattern")
    if window:
        cfg["sliding_window"] = window
        if isinstance(pattern, list) and len(pattern) == layers:  # per-layer flags: true = sliding
            cfg["layer_types"] = ["sliding_attention" if x else "full_attention" for x in pattern]
        elif isinstance(pattern, int) and pattern > 1:
            cfg["sliding_window_pattern"] = pattern
        elif arch == "gemma3":  # llama.cpp's gemma3 loader hard-codes 5 local : 1 global
            cfg["sliding_window_pattern"] = 6
        elif arch == "gpt-oss":  # sliding on even layers, as in the HF config's layer_types
            cfg["layer_types"] = [
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
            ]

    experts = _scalar_or_max(f.get("expert_count"))
    if experts:
        cfg["num_experts"] = experts
        cfg["num_experts_per_tok"] = _scalar_or_max(f.get("expert_used_count")) or 1
        cfg["moe_intermediate_size"] = _scalar_or_max(f.get("expert_feed_forward_length")) or ff or 0
        shared = _scalar_or_max(f.get("expert_shared_count"))
        shared_ff = _scalar_or_max(f.get("expert_shared_feed_forward_length"))
        if shared:
            cfg["n_shared_experts"] = shared
        if shared_ff:
            cfg["shared_expert_intermediate_size"] = shared_ff
        dense = _scalar_or_max(f.get("leading_dense_block_count"))
        if dense:
            cfg["first_k_dense_replace"] = dense
        step = _scalar_or_max(f.get("interleave_moe_layer_step"))
        if step:
            cfg["interleave_moe_layer_step"] = step

    kv_lora = _scalar_or_max(f.get("attention.kv_lora_rank"))
    if kv_lora:
        rope = _scalar_or_max(f.get("rope.dimension_count")) or 64
        k_mla = _scalar_or_max(f.get("attention.key_length_mla"))
        v_mla = _scalar_or_max(f.get("attention.value_length_mla"))
        cfg["kv_lora_rank"] = kv_lora
        cfg["q_lora_rank"] = _scalar_or_max(f.get("attention.q_lora_rank"))
        cfg["qk_rope_head_dim"] = rope
        cfg["qk_nope_head_dim"] = (k_mla or key_len or rope + 128) - rope
        cfg["v_head_dim"] = v_mla or _scalar_or_max(f.get("attention.value_length")) or 128

    state = _scalar_or_max(f.get("ssm.state_size"))
    if state:
        inner = _scalar_or_max(f.get("ssm.inner_size")) or 2 * hidden
        ssm_heads = _scalar_or_max(f.get("ssm.time_step_rank")) or 0
        cfg.update(
            {
                "mamba_d_state": state,
                "mamba_d_conv": _scalar_or_max(f.get("ssm.conv_kernel")) or 4,
                "mamba_expand": max(1, inner // hidden),
                "mamba_n_groups": _scalar_or_max(f.get("ssm.group_count")) or 1,
            }
        )
        if ssm_heads and inner % ssm_heads == 0:
            cfg["mamba_n_heads"] = ssm_heads
            cfg["mamba_d_head"] = inner // ssm_heads
        # Hybrids store head_count_kv per layer: 0 marks a recurrent (SSM) layer.
        if isinstance(kv_raw, list) and len(kv_raw) == layers and "layer_types" not in cfg:
            cfg["layer_types"] = ["mamba" if not x else "attention" for x in kv_raw]
        elif arch == "mamba" or arch == "mamba2":
            cfg["layer_types"] = ["mamba"] * layers
    interval = _scalar_or_max(f.get("full_attention_interval"))
    if interval and "layer_types" not in cfg:  # Qwen3-Next style: linear-attention layers between
        cfg["layer_types"] = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
        ]
    return cfg


def spec_from_gguf(path: str | Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a GGUF file, with exact weights from its tensor table."""
    from vramlab.sources.hf_config import spec_from_config

    p = Path(path)
    facts = read_gguf_facts(p)
    cfg = config_from_gguf(facts, str(p))
    model_name = name or str(facts.metadata.get("general.name") or p.stem)
    spec = spec_from_config(cfg, name=model_name, source=str(p))
    total = facts.total_bytes
    elems = facts.param_count
    dominant = facts.dominant_type
    quant = QuantSpec(
        method="gguf",
        bits=round(8 * total / elems, 3) if elems else 16.0,  # file-wide bits per weight
        gguf_type=dominant,
        unquantized_dtype="float16",
    )
    return spec.with_(
        quant=quant,
        weights_bytes_exact=total,
        weights_bytes_by_dtype=dict(sorted(facts.tensor_bytes_by_type.items())),
        param_count_exact=elems,
        weights_source="GGUF tensors",
    )
