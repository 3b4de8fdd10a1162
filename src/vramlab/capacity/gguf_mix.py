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
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}
# File types whose per-tensor rules are modelled, and their base type.
MIX_BASE = {
    "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0", "Q6_K": "Q6_K",
    "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K", "F16": "F16", "BF16": "BF16",
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


def _layer_tensors(m: ModelSpec, rules: MixRules, i: int, i_wv: int, n_wv: int) -> int:
    """Bytes of layer *i*'s tensors (attention, MLP or experts, norms, biases)."""
    h, hd = m.hidden_size, m.head_dim
    q_dim, kv_dim = m.num_attention_heads * hd, m.num_kv_heads * hd
    total = 0

    def add(kind: str, ncols: int, nrows: int) -> None:
        nonlocal total
        total += tensor_bytes(_fit(kind, ncols) if kind not in ("F32", "F16", "BF16") else kind, ncols, nrows)

    if m.model_type in FUSED_QKV:
        add(rules.attn_v(i_wv, n_wv, fused=True), h, q_dim + 2 * kv_dim)
    else:
        add(rules.base, h, q_dim)
        add(rules.attn_k(), h, kv_dim)
        add(rules.attn_v(i_wv, n_wv, fused=False), h, kv_dim)
    add(rules.attn_output(), q_dim, h)
    norms = 2 * h + (2 * hd if m.model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text") else 0)  # q/k norms
    if m.model_type.startswith(("gemma2", "gemma3")):
        norms += 2 * h  # post_attention_norm and post_ffw_norm
    if m.attention_bias:
        norms += q_dim + 2 * kv_dim
    total += 4 * norms
    moe = m.num_experts and i in set(m.moe_layer_indices())
    if moe:
        inter, e = m.moe_intermediate_size, m.num_experts
        add(rules.base, h, 2 * inter * e)  # ffn_gate_exps + ffn_up_exps
        n_down = m.num_layers * (2 if m.num_shared_experts and m.shared_expert_intermediate_size else 1)
        add(rules.ffn_down(i, n_down), inter, h * e)
        total += 4 * h * e  # ffn_gate_inp (router), F32
        if m.num_shared_experts and m.shared_expert_intermediate_size:
            s = m.shared_expert_intermediate_size
            add(rules.base, h, 2 * s)
            add(rules.ffn_down(i, n_down), s, h)
    elif m.intermediate_size:
        mats = 2 if m.gated_mlp else 1
        add(rules.base, h, mats * m.intermediate_size)
        add(rules.ffn_down(i, m.num_layers), m.intermediate_size, h)
    return total


def supported(m: ModelSpec, ftype: str | None) -> bool:
    """Plain decoders (attention in every layer, no MLA, no SSM mixers, no MoE shared-expert gates of
    unknown layout) with a modelled file type."""
    if not known_mix(ftype) or m.is_mla or m.vision_params:
        return False
    return all(k in ("full", "sliding") for k in m.kinds[: m.num_layers])


def device_bytes(m: ModelSpec, ftype: str, layers: range, with_output: bool = True) -> int:
    """Bytes of the CUDA model buffer: the offloaded layers' tensors, plus the output norm and matrix."""
    f = ftype.upper()
    # LLM_TYPE_70B (llama-model.cpp): 80-layer llama and qwen2 models.
    rules = MixRules(f, MIX_BASE[f], m.num_layers, m.num_experts, m.num_layers == 80 and m.model_type in ("llama", "qwen2"))
    total = sum(_layer_tensors(m, rules, i, i, m.num_layers) for i in layers)
    if with_output:
        total += tensor_bytes(rules.output(m.hidden_size), m.hidden_size, m.vocab_size) + 4 * m.hidden_size
    return total


def host_embedding_bytes(m: ModelSpec, ftype: str) -> int:
    """The `CPU_Mapped` token embedding: the base type when untied, the output's type when tied."""
    f = ftype.upper()
    rules = MixRules(f, MIX_BASE[f], m.num_layers, m.num_experts, False)
    kind = rules.output(m.hidden_size) if m.tie_word_embeddings else _fit(rules.base, m.hidden_size)
    return tensor_bytes(kind, m.hidden_size, m.vocab_size)
