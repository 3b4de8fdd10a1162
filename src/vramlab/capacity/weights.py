"""Weight bytes per GPU, from exact file facts when known, else from the architecture.

Per-rank accounting mirrors vLLM's parallel layers: column/row-parallel linears split by TP, K/V projections replicated
when TP exceeds the KV heads, vocabulary padded to a multiple of 64 and split by TP, norms and routers replicated,
MLA's low-rank A projections replicated. PP splits the layers evenly; the first stage holds the embedding, the last the
final norm and LM head. Loading also keeps the rotary cos/sin cache (max_position x rotary_dim in the model dtype;
linear RoPE scaling caches max_position x factor positions, see `rope_cache_elems`).

bitsandbytes 4-bit (vLLM `BitsAndBytesLinearMethod`): only linear layers are quantized (embeddings and the LM head are
not `LinearBase`), each one unless `llm_int8_skip_modules` names it; a weight is half a byte plus its absmax per
64-block: fp32 from vLLM 0.9.2 on (PR #19742 `dequantize_dq` expands double-quantized statistics at load), one byte
plus a nested fp32 scale per 256 blocks before that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import lru_cache

from vramlab.capacity.mxfp4 import mxfp4_padding
from vramlab.capacity.quant_names import gguf_quant
from vramlab.capacity.spec import ModelSpec, QuantSpec, dtype_bytes

VOCAB_PADDING = 64  # vLLM DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True)
class WeightBreakdown:
    """Parameters on one rank, split by how they are stored."""

    linear_params: int  # quantizable matrices (attention, MLP)
    expert_params: int  # MoE expert matrices (quantized separately by mxfp4)
    embedding_params: int
    lm_head_params: int
    other_params: int  # norms, routers, biases: kept in the model dtype
    vision_params: int
    rope_cache_elems: int
    skipped_params: int = 0  # of linear + expert params: kept unquantized (bitsandbytes skip list)
    fp32_params: int = 0  # of other_params: stored in fp32 whatever the model dtype (GLM-4.5's router)

    @property
    def total_params(self) -> int:
        return (
            self.linear_params
            + self.expert_params
            + self.embedding_params
            + self.lm_head_params
            + self.other_params
            + self.vision_params
        )


def pp_layer_split(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM's `get_pp_indices` deals them (vllm/distributed/utils.py, 0.5.4-0.27):
    `for i in range(2, remaining_layers + 2): partitions[-i] += 1` -- the remainder goes to the stages before
    the last (the middle ones first), which hold neither the embedding nor the LM head."""
    base, rem = divmod(num_layers, pp)
    split = [base] * pp
    for i in range(2, rem + 2):
        split[-i] += 1
    return split


def _attention_params(m: ModelSpec, tp: int, kind: str) -> tuple[int, int]:
    """(linear, other) params of one attention layer on one TP rank."""
    h = m.hidden_size
    if m.is_mla:
        rope = m.qk_rope_head_dim or 64
        nope = m.qk_nope_head_dim or 128
        v = m.mla_v_head_dim or 128
        r = m.kv_lora_rank or 512
        heads = m.num_attention_heads / tp
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank * heads * (nope + rope)  # q_a replicated, q_b split
            other = m.q_lora_rank
        else:
            q, other = h * heads * (nope + rope), 0
        kv_a = h * (r + rope)  # replicated
        kv_b = r * heads * (nope + v)
        o = heads * v * h
        return int(q + kv_a + kv_b + o), other + r + h
    kv_heads = m.num_kv_heads
    head_dim = m.head_dim
    if kind == "full" and m.global_num_kv_heads:
        kv_heads = m.global_num_kv_heads
        head_dim = m.global_head_dim or head_dim
    q_dim = m.num_attention_heads * head_dim / tp
    kv_local = max(1, kv_heads // tp) if kv_heads >= tp else 1
    kv_dim = kv_local * head_dim
    linear = h * q_dim + 2 * h * kv_dim + q_dim * h
    bias = (q_dim + 2 * kv_dim) if m.attention_bias else 0
    return int(linear), int(bias + 2 * h)  # + input/post-attention norms


def _ssm_params(m: ModelSpec, tp: int, kind: str) -> int:
    """Params of a Mamba-2 or linear-attention mixer on one TP rank."""
    h = m.hidden_size
    if kind == "linear" and m.linear_num_value_heads:
        k = m.linear_num_key_heads * m.linear_key_head_dim
        v = m.linear_num_value_heads * m.linear_value_head_dim
        proj = h * (2 * k + 2 * v + 2 * m.linear_num_value_heads) + v * h
        return int(proj / tp)
    inner = m.mamba_n_heads * m.mamba_head_dim or m.mamba_expand * h
    d_state = m.mamba_d_state or 128
    in_proj = h * (2 * inner + 2 * m.mamba_n_groups * d_state + max(1, m.mamba_n_heads))
    return int((in_proj + inner * h) / tp)


def _mlp_params(m: ModelSpec, inter: int, tp: int) -> int:
    mats = 3 if m.gated_mlp else 2
    return int(mats * m.hidden_size * inter / tp)


def is_layer_skipped_bnb(prefix: str, skip_modules: tuple[str, ...]) -> bool:
    """vLLM's matcher (vllm/model_executor/layers/quantization/bitsandbytes.py `is_layer_skipped_bnb`,
    the same in 0.10-0.29): an entry equal to one dotted component of the module's name, or to one of
    its dotted prefixes (`model.layers.0.mlp` skips `model.layers.0.mlp.gate_up_proj`)."""
    if not skip_modules:
        return False
    parts = prefix.split(".")
    prefixes = {".".join(parts[: i + 1]) for i in range(len(parts))}
    return any(s in parts or s in prefixes for s in skip_modules)


_PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def is_layer_excluded_modelopt(prefix: str, excludes: tuple[str, ...]) -> bool:
    """vLLM's ModelOpt matcher (vllm/model_executor/layers/quantization/modelopt.py
    `ModelOptQuantConfigBase.is_layer_excluded`): the name itself, or for a fused layer every one of its
    shards (`is_layer_skipped` with the packed-modules mapping); an entry that is a substring of the
    name; or an entry that matches it as a wildcard (`fnmatch`)."""
    if not excludes:
        return False
    proj = prefix.rsplit(".", 1)[-1]
    shards = [prefix[: -len(proj)] + s for s in _PACKED.get(proj, (proj,))]
    if all(s in excludes for s in shards):
        return True
    return any(e != prefix and e in prefix for e in excludes) or any(fnmatch(prefix, e) for e in excludes)


def _skipped_layer_params(
    m: ModelSpec,
    i: int,
    kind: str,
    tp: int,
    moe: bool,
    has_mlp: bool,
    skip: tuple[str, ...],
    matcher: Callable[[str, tuple[str, ...]], bool],
) -> int:
    """Linear params of layer *i* (one TP rank) that a skip list keeps unquantized (bitsandbytes
    `llm_int8_skip_modules`, ModelOpt `exclude_modules`), under vLLM's module names (fused `qkv_proj` /
    `gate_up_proj`, `mlp.shared_experts`, `mlp.experts`)."""
    base = f"model.layers.{i}"
    out = 0
    if kind in ("full", "sliding", "chunked"):
        lin, _ = _attention_params(m, tp, kind)
        v_dim = (m.mla_v_head_dim or 128) if m.is_mla else m.head_dim  # as _attention_params counts o_proj
        o_proj = int(m.num_attention_heads * v_dim / tp * m.hidden_size)
        if m.is_mla:  # every MLA projection but o_proj, counted together
            out += (lin - o_proj) if matcher(f"{base}.self_attn.kv_b_proj", skip) else 0
        elif matcher(f"{base}.self_attn.qkv_proj", skip):
            out += lin - o_proj
        if matcher(f"{base}.self_attn.o_proj", skip):
            out += o_proj
    if not has_mlp:
        return out
    if moe:
        if matcher(f"{base}.mlp.experts", skip):
            out += m.num_experts * _mlp_params(m, m.moe_intermediate_size, tp)
        if (
            m.num_shared_experts
            and m.shared_expert_intermediate_size
            and matcher(f"{base}.mlp.shared_experts.gate_up_proj", skip)
        ):
            out += _mlp_params(m, m.shared_expert_intermediate_size, tp)
        return out
    if m.intermediate_size:
        mlp = _mlp_params(m, m.intermediate_size, tp)
        down = mlp // (3 if m.gated_mlp else 2)
        if matcher(f"{base}.mlp.gate_up_proj", skip):
            out += mlp - down
        if matcher(f"{base}.mlp.down_proj", skip):
            out += down
    return out


def lora_slot_params(
    m: ModelSpec, tp: int = 1, pp: int = 1, rank_pp: int = 0, max_lora_rank: int = 16, max_loras: int = 1
) -> int:
    """Elements of the LoRA A/B buffers vLLM allocates at load with `--enable-lora`, on one GPU.

    vllm/lora/layers/base_linear.py `BaseLinearLayerWithLoRA.create_lora_weights`: per wrapped linear
    and per slice (3 for qkv_proj, 2 for gate_up_proj), `lora_a_stacked` (max_loras, 1, max_lora_rank,
    input_size) and `lora_b_stacked` (max_loras, 1, output_size, max_lora_rank), input/output per TP
    partition as the base layer holds them (column-parallel: full input, split output; row-parallel:
    split input, full output), in the LoRA dtype (the model's under `auto`). They are allocated inside
    the loading step, so "Model loading took" includes them. Counted: attention and dense MLP linears;
    not counted: embedding / LM-head LoRA (vocab x rank, < 0.03 GiB on 150k vocabularies) and MoE experts."""
    r = max_lora_rank
    h = m.hidden_size
    split = pp_layer_split(m.num_layers, pp)
    start = sum(split[:rank_pp])
    moe_layers = set(m.moe_layer_indices())
    kinds = m.kinds
    total = 0.0
    for i in range(start, start + split[rank_pp]):
        kind = kinds[i] if i < len(kinds) else "full"
        if kind in ("full", "sliding", "chunked") and not m.is_mla:
            q = m.num_attention_heads * m.head_dim / tp
            kv = (max(1, m.num_kv_heads // tp) if m.num_kv_heads >= tp else 1) * m.head_dim
            total += 3 * r * h + r * (q + 2 * kv)  # qkv_proj: three slices
            total += r * q + r * h  # o_proj (row-parallel)
        has_mlp = not m.block_typed or kind == "mlp"
        if has_mlp and i not in moe_layers and m.intermediate_size:
            inter = m.intermediate_size / tp
            if m.gated_mlp:
                total += 2 * r * h + 2 * r * inter  # gate_up_proj: two slices
            else:
                total += r * h + r * inter
            total += r * inter + r * h  # down_proj (row-parallel)
    return int(total * max_loras)


def rope_cache_elems(m: ModelSpec) -> int:
    """Elements of the rotary cos/sin caches vLLM builds (one per distinct RoPE, shared by the layers).

    Linear scaling caches `max_position x factor` positions (vllm/model_executor/layers/rotary_embedding
    `LinearScalingRotaryEmbedding._compute_cos_sin_cache`: max_len = max_position_embeddings x
    scaling_factor). Gemma 3's sliding layers use their own unscaled RoPE (`rope_local_base_freq`,
    rope_type default) beside the global layers' scaled one (vllm/model_executor/models/gemma3.py
    `Gemma3Attention`): two caches. Gemma-3-4B: 131072 x 8 x 256 bf16 = 0.5 GiB."""
    rotary_dim = (
        (m.qk_rope_head_dim or int(m.head_dim * m.partial_rotary_factor)) if m.attention_layers else 0
    )
    base = m.max_position_embeddings * rotary_dim  # Llama 4 Scout: 10.5M positions -> ~2.5 GiB
    if (m.rope_scaling_type or "").lower() != "linear" or m.rope_scaling_factor <= 1:
        return base
    scaled = int(m.max_position_embeddings * m.rope_scaling_factor) * rotary_dim
    local = base if m.model_type.startswith("gemma3") and "sliding" in m.kinds else 0
    return scaled + local


def breakdown(
    m: ModelSpec,
    tp: int = 1,
    pp: int = 1,
    rank_pp: int = 0,
    skip: tuple[str, ...] = (),
    matcher: Callable[[str, tuple[str, ...]], bool] = is_layer_skipped_bnb,
) -> WeightBreakdown:
    """Parameters held by one GPU (TP rank 0 of pipeline stage *rank_pp*); *skip*: the modules a
    checkpoint keeps unquantized, matched by *matcher*, counted in `skipped_params`."""
    split = pp_layer_split(m.num_layers, pp)
    start = sum(split[:rank_pp])
    layers = range(start, start + split[rank_pp])
    moe_layers = set(m.moe_layer_indices())
    kinds = m.kinds
    typed = m.block_typed
    linear = experts = other = skipped = fp32 = 0
    for i in layers:
        kind = kinds[i] if i < len(kinds) else "full"
        if skip:
            has_mlp = not typed or kind == "mlp"
            skipped += _skipped_layer_params(m, i, kind, tp, i in moe_layers, has_mlp, skip, matcher)
        if kind in ("mamba", "linear"):
            linear += _ssm_params(m, tp, kind)
            other += 2 * m.hidden_size
        elif kind != "mlp":
            lin, oth = _attention_params(m, tp, kind)
            linear += lin
            other += oth
        if typed and kind != "mlp":
            continue
        if i in moe_layers:
            experts += m.num_experts * _mlp_params(m, m.moe_intermediate_size, tp)
            other += m.num_experts * m.hidden_size  # router, replicated
            if m.fp32_router:
                # vllm/model_executor/models/glm4_moe.py `Glm4MoE`: `nn.Linear(..., dtype=torch.float32)` and
                # an fp32 `e_score_correction_bias` (n_routed_experts), both whatever the model dtype.
                other += m.num_experts
                fp32 += m.num_experts * (m.hidden_size + 1)
            if m.num_shared_experts and m.shared_expert_intermediate_size:
                linear += _mlp_params(m, m.shared_expert_intermediate_size, tp)
        elif m.intermediate_size:
            linear += _mlp_params(m, m.intermediate_size, tp)
    vocab_local = math.ceil(m.vocab_size / VOCAB_PADDING) * VOCAB_PADDING // tp
    first, last = rank_pp == 0, rank_pp == pp - 1
    embedding = vocab_local * m.hidden_size if first else 0
    lm_head = vocab_local * m.hidden_size if last and not (m.tie_word_embeddings and first) else 0
    if last:
        other += m.hidden_size  # final norm
    return WeightBreakdown(
        linear_params=linear,
        expert_params=experts,
        embedding_params=embedding,
        lm_head_params=lm_head,
        other_params=other,
        vision_params=m.vision_params // tp if first else 0,
        rope_cache_elems=rope_cache_elems(m),
        skipped_params=skipped,
        fp32_params=fp32,
    )


BNB_BLOCK = 64  # bitsandbytes 4-bit blocksize (quantize_4bit default; vLLM passes no other)
BNB_NESTED_BLOCK = 256  # double quantization: one fp32 scale per 256 absmax bytes


def _quant_bytes_per_param(q: QuantSpec, bnb_nested_absmax: bool = False) -> float:
    """Stored bytes per quantized weight, scales and zeros included.

    *bnb_nested_absmax*: the engine keeps double-quantized bitsandbytes statistics as loaded (vLLM
    before 0.9.2); otherwise they are fp32, one per 64-block."""
    b = q.bits / 8
    method = q.method
    if method in ("awq", "gptq") or (method.startswith("compressed-tensors") and q.group_size):
        g = q.group_size or 4096  # per channel ~ one scale per column
        scale = 2 / g  # fp16 scale per group
        zeros = (q.bits / 8) / g if q.has_zeros else 0.0
        return b + scale + zeros
    if method == "bitsandbytes":
        if q.bits != 4:
            return b + 4 / 4096  # int8: one fp32 scale per row
        if bnb_nested_absmax and q.double_quant:
            return b + 1 / BNB_BLOCK + 4 / (BNB_BLOCK * BNB_NESTED_BLOCK)  # uint8 absmax + nested fp32
        return b + 4 / BNB_BLOCK  # fp32 absmax per 64-block
    if method in ("nvfp4", "compressed-tensors-nvfp4"):
        # vllm/model_executor/layers/quantization/modelopt.py `ModelOptNvFp4LinearMethod.create_weights`:
        # `weight` uint8 (out, in // 2), `weight_scale` fp8 e4m3 (out, in // group_size); the fp32
        # global scales (`weight_scale_2`, `input_scale`) are one per fused shard, left out.
        return 0.5 + 1 / (q.group_size or 16)
    if method == "fp8" and q.group_size:
        return b + 4 / q.group_size  # one fp32 scale per weight block (block-quantized checkpoints)
    if method in ("fp8", "compressed-tensors-fp8", "compressed-tensors"):
        return b + 4 / 4096  # per-channel fp32 scales
    return b


@lru_cache(maxsize=512)  # pure in hashable inputs; sweeps ask the same question many times
def weight_bytes(
    m: ModelSpec,
    dtype: str = "auto",
    quantization: str | None = None,
    tp: int = 1,
    pp: int = 1,
    rank_pp: int = 0,
    rope_cache: bool = True,
    bnb_nested_absmax: bool = False,
    mxfp4_layout: str = "flashinfer",
) -> tuple[int, str]:
    """Bytes of weights on one GPU, and how they were obtained ("exact" or "formula").

    *rope_cache*: add the rotary cos/sin cache vLLM and SGLang build at load time.
    *bnb_nested_absmax*: double-quantized bitsandbytes statistics stay compressed (vLLM < 0.9.2).
    *mxfp4_layout*: the MXFP4 MoE backend whose padding the stored experts take (`MXFP4_PADS`).
    """
    q = effective_quant(m, quantization)
    model_dtype = resolve_dtype(m, dtype, q)
    if m.weights_bytes_exact and pp == 1 and q == m.quant:
        # Headers give the checkpoint's bytes; TP splits nearly all of it.
        wb = breakdown(m, tp, pp, rank_pp)
        rope = wb.rope_cache_elems * dtype_bytes(model_dtype) if rope_cache else 0
        # "exact" = the headers' bytes at the dtype the engine loads (a cast at load scales them).
        exact = m.weights_bytes_exact
        stored = stored_dtype(m)
        if m.quant is None and model_dtype != stored:
            exact = int(exact * dtype_bytes(model_dtype) / dtype_bytes(stored))
        return int(exact / tp + rope), "exact"
    skip = q.skip_modules if q is not None and q.method in ("bitsandbytes", "nvfp4", "fp8") else ()
    wb = breakdown(
        m,
        tp,
        pp,
        rank_pp,
        skip,
        is_layer_skipped_bnb if q is None or q.method == "bitsandbytes" else is_layer_excluded_modelopt,
    )
    full = dtype_bytes(model_dtype)
    unq = full if q is None else dtype_bytes(q.unquantized_dtype if model_dtype == "float32" else model_dtype)
    other = wb.other_params - wb.fp32_params
    if q is None:
        total = (wb.total_params - wb.fp32_params) * full
    else:
        per = _quant_bytes_per_param(q, bnb_nested_absmax)
        if q.method == "mxfp4" or q.quantize_experts_only:
            total = (
                wb.expert_params * mxfp4_padding(m, tp, mxfp4_layout) * per + (wb.linear_params + other) * unq
            )
        else:
            quantized = wb.linear_params + wb.expert_params - wb.skipped_params
            total = quantized * per + (wb.skipped_params + other) * unq
        total += wb.embedding_params * (per if q.quantize_embedding else unq)
        total += wb.lm_head_params * (per if q.quantize_lm_head else unq)
        total += wb.vision_params * unq
    total += wb.fp32_params * 4
    if rope_cache:
        total += wb.rope_cache_elems * full
    return int(total), "formula"


def effective_quant(m: ModelSpec, quantization: str | None) -> QuantSpec | None:
    """The checkpoint's quantization, or the one asked for at load time (`--quantization fp8`)."""
    if quantization in (None, "", "none", "auto"):
        return m.quant
    qn = quantization.lower()
    if m.quant is not None and m.quant.method == "gguf":
        return m.quant  # the file's own tensor types are exact
    gq = gguf_quant(qn) if qn not in ("f16", "bf16", "f32", "mxfp4") else None
    if gq is not None:
        return gq
    if m.quant is not None and (
        qn == m.quant.method
        or qn.startswith(m.quant.method.split("-")[0])
        or m.quant.method.startswith(qn.split("_")[0])
    ):
        return m.quant
    if qn in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        return QuantSpec("fp8", 8.0, unquantized_dtype=m.torch_dtype)
    if qn in ("awq", "awq_marlin"):
        return QuantSpec("awq", 4.0, group_size=128, unquantized_dtype="float16")
    if qn in ("gptq", "gptq_marlin"):
        return QuantSpec("gptq", 4.0, group_size=128, has_g_idx=True, unquantized_dtype="float16")
    if qn in ("bitsandbytes", "bnb", "bnb-4bit"):
        # In-flight: vLLM's BitsAndBytesModelLoader._unquantized_generator calls
        # quantize_4bit(..., compress_statistics=True, quant_type="nf4"): double-quantized statistics.
        return QuantSpec(
            "bitsandbytes", 4.0, group_size=64, unquantized_dtype=m.torch_dtype, double_quant=True
        )
    if qn in ("mxfp4",):
        return QuantSpec("mxfp4", 4.25, quantize_experts_only=True, unquantized_dtype=m.torch_dtype)
    if qn in ("int8", "w8a8", "compressed-tensors-w8a8", "bnb-8bit"):
        return QuantSpec("compressed-tensors", 8.0, unquantized_dtype=m.torch_dtype)
    if qn in ("w4a16", "int4", "compressed-tensors-w4a16"):
        return QuantSpec(
            "compressed-tensors", 4.0, group_size=128, has_zeros=False, unquantized_dtype=m.torch_dtype
        )
    if qn in ("nvfp4", "modelopt_fp4"):
        return QuantSpec("nvfp4", 4.0, group_size=16, has_zeros=False, unquantized_dtype=m.torch_dtype)
    if qn == "compressed-tensors":
        return m.quant or QuantSpec("compressed-tensors", 8.0, unquantized_dtype=m.torch_dtype)
    return QuantSpec(qn, 8.0, unquantized_dtype=m.torch_dtype)


def resolve_dtype(
    m: ModelSpec, dtype: str, q: QuantSpec | None = None, engine: str = "vllm", version: tuple[int, ...] = ()
) -> str:
    """The activation/weight dtype the engine runs: --dtype, else the engine's default.

    Serving engines (vLLM, SGLang, TGI) take the config's dtype and cast fp32 checkpoints to bf16;
    AWQ/GPTQ kernels run in float16. transformers 5.x loads the checkpoint's own dtype (`auto`,
    float32 included); 4.x loaded float32 unless told otherwise.
    """
    d = (dtype or "auto").replace("torch.", "")
    aliases = {
        "half": "float16",
        "fp16": "float16",
        "bf16": "bfloat16",
        "float": "float32",
        "fp32": "float32",
    }
    d = aliases.get(d, d)
    if d != "auto":
        return d
    if engine == "transformers":
        if version and version < (5,):
            return "float32"
        return m.torch_dtype if m.torch_dtype in ("bfloat16", "float16", "float32") else "bfloat16"
    if q is not None and q.method in ("awq", "gptq"):
        return "float16"
    return m.torch_dtype if m.torch_dtype in ("bfloat16", "float16") else "bfloat16"


def stored_dtype(m: ModelSpec) -> str:
    """The dtype most of the checkpoint's bytes are stored in (headers when read, else the config)."""
    by_dtype = {
        k: v
        for k, v in (m.weights_bytes_by_dtype or {}).items()
        if k.upper() in ("F32", "F16", "BF16", "FLOAT32", "FLOAT16", "BFLOAT16")
    }
    if by_dtype:
        top = max(by_dtype, key=lambda k: by_dtype[k])
        return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(top.upper(), top.lower())
    return m.torch_dtype
