"""The tensor types inside a llama.cpp quantization mix (Q4_K_M, Q5_K_M, ...), tensor by tensor.

A file type is not one type: `llama-quantize` picks each tensor's type from its role and layer
(src/llama-quant.cpp, `llama_tensor_get_type_impl`, ggml-org/llama.cpp; the rules below are that
function's for the listed file types, unchanged since the K-quants landed in 2023):

- `output.weight` (and `token_embd.weight` when the embeddings are tied, as it then serves as the
  output) -> Q6_K, unless the mix's base type is Q8_0 or the row length is not a multiple of the
  base type's block (then Q8_0);
- attn_v (and fused attn_qkv): Q4_K_M / Q5_K_M -> Q6_K where `use_more_bits(i, n)` (the first and
  last eighth of the layers and every third in between); Q4_K_S -> Q5_K in the first 4; fused
  attn_qkv: Q4_K_M -> Q5_K, Q5_K_M -> Q6_K; 70B models (80-layer llama/qwen2) Q3_K/Q4_K -> Q5_K; 8 experts -> Q8_0;
- ffn_down: Q4_K_M / Q5_K_M -> Q6_K where `use_more_bits`; Q4_K_S -> Q5_K in the first eighth;
- attn_k with 8 experts -> Q8_0; attn_output with 8 experts and Q4_K_* -> Q5_K;
- a row length that is not a multiple of 256 drops a K type to its fallback (Q4_K -> Q5_0,
  Q5_K -> Q5_1, Q6_K -> Q8_0: `tensor_type_fallback`);
- norms, biases and routers stay F32.

`device_bytes` sums what llama.cpp puts in the `CUDA0 model buffer` for the layers offloaded:
every layer tensor, the output norm and the output matrix, not the untied token embedding (that
stays in the `CPU_Mapped` buffer; a tied one is duplicated onto the GPU as the output).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlab.capacity.spec import ModelSpec

# (block elements, block bytes) of ggml's types (ggml/src/ggml.c type_traits).
TYPE_SIZE: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}
# File types whose per-tensor rules are modelled, and their base type.
MIX_BASE = {
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q8_0": "Q8_0",
    "Q6_K": "Q6_K",
    "Q4_K_S": "Q4_K",
    "Q4_K_M": "Q4_K",
    "Q5_K_S": "Q5_K",
    "Q5_K_M": "Q5_K",
    "F16": "F16",
    "BF16": "BF16",
}
# GGUF architectures that store one fused attn_qkv and one fused ffn_up (gate and up) per layer.
FUSED_QKV = ("phi3",)


def known_mix(ftype: str | None) -> bool:
    return bool(ftype) and str(ftype).upper() in MIX_BASE


def tensor_bytes(kind: str, ncols: int, nrows: int) -> int:
    block, size = TYPE_SIZE[kind]
    return (ncols // block) * size * nrows


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fit(kind: str, ncols: int) -> str:
    """`tensor_type_fallback`: a row length the block does not divide drops to a 32-block type."""
    block, _ = TYPE_SIZE[kind]
    if ncols % block == 0:
        return kind
    kind = FALLBACK.get(kind, "F16")
    return kind if ncols % TYPE_SIZE[kind][0] == 0 else "F16"


@dataclass(frozen=True)
class MixRules:
    ftype: str
    base: str
    n_layers: int
    n_experts: int
    is_70b: bool

    def output(self, ncols: int) -> str:
        if self.base in ("F16", "BF16"):
            return self.base
        if ncols % TYPE_SIZE[self.base][0] != 0 or self.base == "Q8_0":
            return "Q8_0"
        return "Q6_K"

    def attn_v(self, i_wv: int, n_wv: int, fused: bool) -> str:
        t, f = self.base, self.ftype
        if fused:
            return {"Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}.get(f, t)
        if f in ("Q4_K_M", "Q5_K_M") and use_more_bits(i_wv, n_wv):
            t = "Q6_K"
        elif f == "Q4_K_S" and i_wv < 4:
            t = "Q5_K"
        if self.is_70b and t == "Q4_K":
            t = "Q5_K"
        return "Q8_0" if self.n_experts == 8 else t

    def attn_k(self) -> str:
        return "Q8_0" if self.n_experts == 8 and self.base not in ("F16", "BF16") else self.base

    def attn_output(self) -> str:
        return "Q5_K" if self.n_experts == 8 and self.ftype in ("Q4_K_S", "Q4_K_M") else self.base

    def ffn_down(self, i_layer: int, n: int) -> str:
        """*n*: the number of ffn_down tensors (`n_ffn_down`: two per MoE layer with a shared expert)."""
        f = self.ftype
        if f in ("Q4_K_M", "Q5_K_M") and use_more_bits(i_layer, n):
            return "Q6_K"
        if f == "Q4_K_S" and i_layer < n // 8:
            return "Q5_K"
        return self.base


def layer_tensors(m: ModelSpec, rules: MixRules, i: int, i_wv: int, n_wv: int) -> list[tuple[str, int]]:
    """Layer *i*'s tensors as (GGUF name, bytes): attention, MLP or experts, norms, biases. The names are
    the ones `--override-tensor` patterns match (`blk.12.ffn_up_exps.weight`)."""
    h, hd = m.hidden_size, m.head_dim
    q_dim, kv_dim = m.num_attention_heads * hd, m.num_kv_heads * hd
    out: list[tuple[str, int]] = []

    def add(name: str, kind: str, ncols: int, nrows: int) -> None:
        fitted = _fit(kind, ncols) if kind not in ("F32", "F16", "BF16") else kind
        out.append((f"blk.{i}.{name}.weight", tensor_bytes(fitted, ncols, nrows)))

    if m.model_type in FUSED_QKV:
        add("attn_qkv", rules.attn_v(i_wv, n_wv, fused=True), h, q_dim + 2 * kv_dim)
    else:
        add("attn_q", rules.base, h, q_dim)
        add("attn_k", rules.attn_k(), h, kv_dim)
        add("attn_v", rules.attn_v(i_wv, n_wv, fused=False), h, kv_dim)
    add("attn_output", rules.attn_output(), q_dim, h)
    norms = 2 * h + (
        2 * hd if m.model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text") else 0
    )  # q/k norms
    if m.model_type.startswith(("gemma2", "gemma3")):
        norms += 2 * h  # post_attention_norm and post_ffw_norm
    if m.attention_bias:
        norms += q_dim + 2 * kv_dim
    out.append((f"blk.{i}.attn_norm.weight", 4 * norms))  # every norm and bias of the layer, F32
    moe = m.num_experts and i in set(m.moe_layer_indices())
    if moe:
        inter, e = m.moe_intermediate_size, m.num_experts
        add("ffn_gate_exps", rules.base, h, inter * e)
        add("ffn_up_exps", rules.base, h, inter * e)
        n_down = m.num_layers * (2 if m.num_shared_experts and m.shared_expert_intermediate_size else 1)
        add("ffn_down_exps", rules.ffn_down(i, n_down), inter, h * e)
        out.append((f"blk.{i}.ffn_gate_inp.weight", 4 * h * e))  # the router, F32
        if m.num_shared_experts and m.shared_expert_intermediate_size:
            s = m.shared_expert_intermediate_size
            add("ffn_gate_shexp", rules.base, h, s)
            add("ffn_up_shexp", rules.base, h, s)
            add("ffn_down_shexp", rules.ffn_down(i, n_down), s, h)
    elif m.intermediate_size:
        if m.gated_mlp:
            add("ffn_gate", rules.base, h, m.intermediate_size)
        add("ffn_up", rules.base, h, m.intermediate_size)
        add("ffn_down", rules.ffn_down(i, m.num_layers), m.intermediate_size, h)
    return out


def _layer_tensors(m: ModelSpec, rules: MixRules, i: int, i_wv: int, n_wv: int) -> int:
    return sum(size for _, size in layer_tensors(m, rules, i, i_wv, n_wv))


def rules_for(m: ModelSpec, ftype: str) -> MixRules:
    f = ftype.upper()
    # LLM_TYPE_70B (llama-model.cpp): 80-layer llama and qwen2 models.
    return MixRules(
        f, MIX_BASE[f], m.num_layers, m.num_experts, m.num_layers == 80 and m.model_type in ("llama", "qwen2")
    )


def output_tensors(m: ModelSpec, ftype: str) -> list[tuple[str, int]]:
    """The output layer: `output.weight` (the tied embedding's copy when tied) and `output_norm.weight`."""
    rules = rules_for(m, ftype)
    return [
        ("output.weight", tensor_bytes(rules.output(m.hidden_size), m.hidden_size, m.vocab_size)),
        ("output_norm.weight", 4 * m.hidden_size),
    ]


def supported(m: ModelSpec, ftype: str | None) -> bool:
    """Plain decoders (attention in every layer, no MLA, no SSM mixers, no MoE shared-expert gates of
    unknown layout) with a modelled file type."""
    if not known_mix(ftype) or m.is_mla or m.vision_params:
        return False
    return all(k in ("full", "sliding") for k in m.kinds[: m.num_layers])


def device_bytes(m: ModelSpec, ftype: str, layers: range, with_output: bool = True) -> int:
    """Bytes of the CUDA model buffer: the offloaded layers' tensors, plus the output norm and matrix."""
    rules = rules_for(m, ftype)
    total = sum(_layer_tensors(m, rules, i, i, m.num_layers) for i in layers)
    if with_output:
        total += sum(size for _, size in output_tensors(m, ftype))
    return total


def host_embedding_bytes(m: ModelSpec, ftype: str) -> int:
    """The `CPU_Mapped` token embedding: the base type when untied, the output's type when tied."""
    f = ftype.upper()
    rules = MixRules(f, MIX_BASE[f], m.num_layers, m.num_experts, False)
    kind = rules.output(m.hidden_size) if m.tie_word_embeddings else _fit(rules.base, m.hidden_size)
    return tensor_bytes(kind, m.hidden_size, m.vocab_size)
