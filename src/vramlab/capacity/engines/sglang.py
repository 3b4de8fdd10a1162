"""SGLang's memory policy (docs/research/capacity-anchors.md §2).

`mem_fraction_static` is the share, for weights + KV pool, of the memory free once the CUDA context
and NCCL are up (`min_per_gpu_memory`, measured right after `init_torch_distributed`, min over ranks;
model_runner.py passes it to `profile_max_num_token` as `total_gpu_memory`):
    rest = free_after_weights - free_at_init x (1 - mem_fraction_static);  tokens = rest // cell_size
The remaining `(1 - mem_fraction_static) x free_at_init` holds activations, CUDA graphs and runtime.
The default fraction has three generations: a table by TP size (to 0.4.6), GPU-size buckets (PR #7054,
0.4.7) and a reservation heuristic (PR #10975, 2025-09, 0.5.3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from vramlab.capacity import allocator
from vramlab.capacity import weights as wmod
from vramlab.capacity.defaults import sglang_fraction as default_fraction
from vramlab.capacity.defaults import sglang_gpu_defaults as gpu_defaults
from vramlab.capacity.defaults import sglang_max_running
from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.estimate import ENGINE, Component, Limits, band
from vramlab.capacity.overheads import forward_peak_bytes, moe_workspace_bytes
from vramlab.capacity.spec import dtype_bytes
from vramlab.errors import ConfigError
from vramlab.units import gib

SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio default
HYBRID_SWA_ARCHS = frozenset(
    {
        "Llama4ForConditionalGeneration",
        "GptOssForCausalLM",
        "MiMoV2FlashForCausalLM",
        "Step3p5ForCausalLM",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
    }
)
# Qwen3MoeForCausalLM builds routed_experts_weights_of_layer eagerly in load_weights (keeps_bf16_experts).
QWEN3_MOE_EAGER_EXPERT_DICT = ((0, 4, 7), (0, 5, 9))
HYBRID_SWA_FROM = (0, 4, 9)  # PR #7367 (July 2025 CI runs); the first release is not pinned
GPT_OSS_HYBRID_AFTER = (0, 5, 8)  # disabled by server_args up to at least January 2026 (PR #17630's repro)
CONTEXT_EXTRA_BAND = (
    0.5  # SGLang's CUDA context is not measured apart from vLLM's: unknown term, band widened
)


def weight_tensors(ctx: Context, lin: float) -> list[tuple[int, int, int]] | None:
    """(bytes, module, parts) of each weight tensor one TP rank allocates, in creation order (embedding, then
    per layer qkv_proj + bias, o_proj, gate_up_proj / fused-MoE w13 + w2 and router, norms; then the LM head),
    with *lin* bytes per element of the quantizable linear weights; *module* numbers the module whose
    quant method owns the tensor (-1: not quantized) and *parts* is its experts (1 for a plain linear).
    None where the layout is not modelled (MLA, SSM, vision towers)."""
    m, tp = ctx.model, ctx.tp
    if (
        m.is_mla
        or m.vision_params
        or ctx.pp > 1
        or any(k not in ("full", "sliding") for k in m.kinds[: m.num_layers])
    ):
        return None
    unq = dtype_bytes(ctx.dtype)
    h, hd = m.hidden_size, m.head_dim
    q_dim = m.num_attention_heads // tp * hd
    kv_dim = max(1, m.num_kv_heads // tp) * hd
    vocab = -(-m.vocab_size // wmod.VOCAB_PADDING) * wmod.VOCAB_PADDING // tp
    out = [(int(vocab * h * unq), -1, 1)]
    module = 0

    def linear(elements: int, parts: int = 1, same_module: bool = False) -> None:
        nonlocal module
        module += 0 if same_module else 1
        out.append((int(elements * lin), module, parts))

    moe = set(m.moe_layer_indices())
    for i in range(m.num_layers):
        linear((q_dim + 2 * kv_dim) * h)
        if m.attention_bias:
            out.append((int((q_dim + 2 * kv_dim) * unq), -1, 1))
        linear(q_dim * h)
        if i in moe:
            inter = m.moe_intermediate_size // tp
            linear(m.num_experts * 2 * inter * h, m.num_experts)
            linear(m.num_experts * inter * h, m.num_experts, same_module=True)
            out.append((int(m.num_experts * h * unq), -1, 1))
            if m.num_shared_experts and m.shared_expert_intermediate_size:
                shared = m.shared_expert_intermediate_size // tp
                linear(2 * shared * h)
                linear(shared * h)
        elif m.intermediate_size:
            inter = m.intermediate_size // tp
            linear((2 if m.gated_mlp else 1) * inter * h)
            linear(inter * h)
        out += [(int(h * unq), -1, 1), (int(h * unq), -1, 1)]
    if not m.tie_word_embeddings:
        out.append((int(vocab * h * unq), -1, 1))
    return out


def weight_tensor_sizes(ctx: Context) -> list[int] | None:
    """Bytes of each weight tensor one TP rank allocates, in creation order (`weight_tensors`); the packed
    weight of a quantized checkpoint (its scales are own small tensors)."""
    lin = ctx.quant.bits / 8 if ctx.quant is not None else dtype_bytes(ctx.dtype)
    tensors = weight_tensors(ctx, lin)
    return [size for size, _, _ in tensors] if tensors is not None else None


def online_fp8(ctx: Context) -> bool:
    """`--quantization fp8` on an unquantized checkpoint: SGLang quantizes after loading."""
    return ctx.model.quant is None and ctx.quant is not None and ctx.quant.method == "fp8"


@dataclass(frozen=True)
class OnlineFp8Load:
    """What online FP8 leaves on one rank beyond the FP8 weights, and the load's peak."""

    kept_bf16_bytes: int  # bf16 expert weights a model's expert-weight dict still references
    rounding_bytes: int  # segments of freed bf16 tensors that FP8 copies keep reserved, and segment rounding
    peak_bytes: int  # reserved just before `empty_cache`: the whole bf16 model plus the FP8 copies made


def keeps_bf16_experts(ctx: Context) -> bool:
    """Qwen3MoeForCausalLM.load_weights (python/sglang/srt/models/qwen3_moe.py) ends by building
    `self.routed_experts_weights_of_layer = {layer_id: mlp.get_moe_weights() ...}` (`x.data` of every expert
    parameter) eagerly, before the loader runs `process_weights_after_loading`: the bf16 w13/w2 tensors stay
    referenced after Fp8MoEMethod replaces them. Read in the 0.4.6.post5, 0.4.7, 0.4.9, 0.5.2, 0.5.5, 0.5.7 and
    0.5.8 wheels; 0.4.6.post3 has no such dict, 0.5.9 and 0.5.10 wrap it in a LazyValue (built on first use, by
    EPLB). Post releases are not told apart: 0.4.6 plans without it."""
    version = ctx.version
    low, high = QWEN3_MOE_EAGER_EXPERT_DICT
    return ctx.model.architecture == "Qwen3MoeForCausalLM" and bool(version) and low <= version < high


def online_fp8_load(ctx: Context) -> OnlineFp8Load | None:
    """Online FP8 (`--quantization fp8` on a bf16 checkpoint) as SGLang loads it
    (python/sglang/srt/model_loader/loader.py `load_weights_and_postprocess`, layers/quantization/fp8.py; read
    in the 0.4.7, 0.4.9, 0.5.2, 0.5.5, 0.5.10 and 0.5.23 wheels; older releases are planned the same, unread).
    `Fp8LinearMethod` / `Fp8MoEMethod.create_weights` allocate the weights in the model dtype when the checkpoint is not FP8; `model.load_weights` fills the whole
    model; then each module in turn quantizes: a linear allocates its FP8 copy (`per_token_group_quant_fp8` or
    `input_to_float8`) and drops the bf16 tensor; a fused-MoE layer allocates FP8 w13 and w2
    (`torch.empty_like`), quantizes expert by expert through a `scaled_fp8_quant` temporary and drops both bf16
    tensors, unless a model still references them (`keeps_bf16_experts`). Every FP8 tensor lands by best fit in
    a segment a bf16 tensor freed, so `empty_cache` before the weight and KV readings
    (`get_available_gpu_memory`) cannot return the rest of those segments (allocator.py)."""
    if not online_fp8(ctx):
        return None
    tensors = weight_tensors(ctx, dtype_bytes(ctx.dtype))
    if tensors is None:
        kept = kept_experts_per_stage(ctx) if ctx.pp > 1 and keeps_bf16_experts(ctx) else 0
        # pipeline stages: the kept experts are counted, the allocator replay (segments, load peak) is not
        return OnlineFp8Load(kept, 0, 0) if kept else None
    return replay_online_fp8(tuple(tensors), dtype_bytes(ctx.dtype), keeps_bf16_experts(ctx))


def kept_experts_per_stage(ctx: Context) -> int:
    """The bf16 w13 and w2 `keeps_bf16_experts` leaves on one GPU of a pipeline stage: every MoE layer's
    experts x (2 + 1) x moe_intermediate/tp x hidden in the model dtype, the layers split evenly over the
    stages (as the plan splits the weights)."""
    m = ctx.model
    per_layer = (
        m.num_experts * 3 * (m.moe_intermediate_size // ctx.tp) * m.hidden_size * dtype_bytes(ctx.dtype)
    )
    return int(per_layer * len(m.moe_layer_indices()) / ctx.pp)


@lru_cache(maxsize=16)
def replay_online_fp8(tensors: tuple[tuple[int, int, int], ...], unq: float, keep: bool) -> OnlineFp8Load:
    """The allocator through the load and the module-by-module quantization (`online_fp8_load`); cached, since
    a plan's suggestions re-plan the same model many times."""
    heap = allocator.Allocator()
    handles = [heap.alloc(size) for size, _, _ in tensors]
    live = sum(size for size, module, _ in tensors if module < 0)
    kept = 0
    for module in sorted({mod for _, mod, _ in tensors if mod >= 0}):
        members = [(i, size, parts) for i, (size, mod, parts) in enumerate(tensors) if mod == module]
        fp8_sizes = [int(size / unq) for _, size, _ in members]
        live += sum(fp8_sizes)
        for fp8_size in fp8_sizes:
            heap.alloc(fp8_size)
        experts = members[0][2]
        for _ in range(experts if experts > 1 else 0):  # one temporary per expert and tensor
            for fp8_size in fp8_sizes:
                heap.release(heap.alloc(fp8_size // experts), fp8_size // experts)
        for i, size, _ in members:
            if keep and experts > 1:
                kept += size
            else:
                heap.release(handles[i], size)
    peak = heap.reserved()
    heap.empty_cache()
    return OnlineFp8Load(kept, heap.reserved() - live - kept, peak)


def mla_absorbed_bytes(ctx: Context) -> int:
    """DeepSeek-style MLA: `post_load_weights` (models/deepseek_v2.py) keeps w_kc and w_vc, contiguous copies
    of kv_b_proj split into its K and V halves, beside kv_b_proj itself: heads/tp x (nope + v) x
    kv_lora_rank per layer, in the model dtype (an FP8 block checkpoint is dequantized to it on CUDA;
    the DeepGEMM bmm path keeps FP8, half of this)."""
    m = ctx.model
    if not m.is_mla:
        return 0
    heads = max(1, m.num_attention_heads // ctx.tp)
    per_layer = heads * ((m.qk_nope_head_dim or 128) + (m.mla_v_head_dim or 128)) * (m.kv_lora_rank or 512)
    return int(m.num_layers * per_layer * dtype_bytes(ctx.dtype))


def weights_as_reported(ctx: Context) -> Component:
    """The weights as SGLang measures them: free memory (mem_get_info after empty_cache) before and after
    loading, so the caching allocator's segment rounding of every weight tensor counts (allocator.py),
    and MLA's absorbed w_kc / w_vc copies made after loading."""
    weights = ctx.weights_component()
    sizes = weight_tensor_sizes(ctx)
    absorbed = mla_absorbed_bytes(ctx)
    online = online_fp8_load(ctx)
    if not sizes and not absorbed and not online:
        return weights
    if online:
        extra = online.rounding_bytes + online.kept_bf16_bytes
    else:
        extra = allocator.rounding_bytes(sizes) if sizes else 0
    note = weights.note
    if online and ctx.pp > 1:
        note += (
            "; online FP8 at pipeline stages: the allocator's segments and the load's peak are not replayed"
        )
    elif online:
        note += (
            f"; + {gib(online.rounding_bytes, unit=True)} of the bf16 weights' segments that the FP8 copies made "
            "after loading keep reserved (online FP8: the checkpoint loads in bf16, then each module quantizes)"
        )
        if online.kept_bf16_bytes:
            note += (
                f"; + {gib(online.kept_bf16_bytes, unit=True)} of bf16 expert weights that "
                "routed_experts_weights_of_layer still references (Qwen3-MoE, SGLang 0.4.7-0.5.8)"
            )
    elif extra:
        note += f"; + {gib(extra, unit=True)} of allocator segment rounding (SGLang reads free memory)"
    if absorbed:
        note += f"; + {gib(absorbed, unit=True)} of MLA w_kc/w_vc copies (post_load_weights)"
    return band(
        "weights",
        weights.bytes + extra + absorbed,
        0.0,
        0.0,
        weights.provenance,
        note,
        abs_low=weights.bytes
        - weights.low_bytes
        + extra
        - (online.kept_bf16_bytes if online else 0)
        + absorbed // 2,
        abs_high=weights.high_bytes - weights.bytes,
    )


def static_components(ctx: Context, chunk: int, graph_max_bs: int) -> list[Component]:
    """Context, NCCL and weights (inside the static pool), then what the reservation must hold."""
    model, settings, constants = ctx.model, ctx.settings, ctx.constants
    components: list[Component] = [
        # vLLM 0.19's figure: SGLang's own context before NCCL init is not pinned (one ~0.4.3 log on an L4:
        # 22.49 GiB card, "avail mem=21.63" after an NCCL init of 0.13, i.e. 0.73 GiB) -> band widened.
        ctx.constant_component(
            "cuda_context",
            "cuda_context_bytes",
            "CUDA context and library handles (unknown term, band widened: vLLM's figure; "
            "an SGLang 0.4 log on an L4 showed 0.73 GiB)",
            extra_band=CONTEXT_EXTRA_BAND,
        ),
    ]
    if ctx.tp * ctx.pp > 1:
        components.append(ctx.nccl_component("NCCL communicators"))
    components.append(weights_as_reported(ctx))
    # Outside the static pool, inside the (1 - fraction) reservation.
    activation = (
        forward_peak_bytes(model, chunk, ctx.tp, ctx.dtype, constants)
        + moe_workspace_bytes(model, chunk, ctx.tp, ctx.dtype, constants)
        + 4 * graph_max_bs * model.vocab_size
    )  # fp32 logits of a full decode batch
    names = ("forward_intermediate_copies", "forward_hidden_copies")
    rel = constants.band(*names) + 0.2
    components.append(
        band(
            "activation_peak",
            activation,
            rel,
            rel,
            constants.provenance(*names),
            f"prefill chunk of {chunk} tokens and decode logits for {graph_max_bs} requests",
            in_budget=False,
        )
    )
    graphs = 0.0 if settings.enforce_eager else constants["sglang_graph_bytes_per_bs"] * graph_max_bs
    if graphs:
        key = "sglang_graph_bytes_per_bs"
        components.append(
            band(
                "cuda_graphs",
                graphs,
                constants.band(key),
                constants.band(key),
                constants.provenance(key),
                f"decode graphs up to batch {graph_max_bs}, captured after the pool",
                in_budget=False,
            )
        )
    return components


def hybrid_swa(ctx: Context) -> bool:
    """Whether SGLang splits the pool into full and sliding-window parts (`is_hybrid_swa_model`,
    configs/model_config.py): only an allowlist of architectures, and not where server_args sets
    `disable_hybrid_swa_memory` (GPT-OSS in 0.4.x-0.5.x releases, still so in January 2026; later only
    with trtllm_mha, Blackwell's default). Every other model with sliding layers (Gemma 2/3, Mistral,
    Cohere2...) stores every token in every layer. The pool itself dates from PR #7367 (mid-2025)."""
    arch, version = ctx.model.architecture, ctx.version
    if arch not in HYBRID_SWA_ARCHS or (version and version < HYBRID_SWA_FROM):
        return False
    if arch == "GptOssForCausalLM":
        sm100 = ctx.gpu.arch == "blackwell" and not ctx.gpu.name.startswith("rtx")  # trtllm_mha by default
        return bool(version) and version > GPT_OSS_HYBRID_AFTER and not sm100
    return True


def token_limits(ctx: Context, context_len: int) -> tuple[Callable[[int], Limits], int, int]:
    """KV bytes -> pool tokens: one cell per token, hybrid SWA pools and Mamba state pools split first."""
    shapes = ctx.kv_shapes()
    cell = sum(shape.layers * shape.bytes_per_token_layer for shape in shapes)
    full = sum(shape.layers * shape.bytes_per_token_layer for shape in shapes if shape.kind == "full")
    sliding = cell - full if hybrid_swa(ctx) else 0
    state = ctx.state_bytes_per_seq()

    def limits(kv_bytes: int) -> Limits:
        rest = max(0, kv_bytes)
        if state:  # Mamba-ish models carve out the state pool first (mamba_full_memory_ratio ~ 0.9)
            rest = int(rest / 1.9)
        if sliding and full:
            # Hybrid SWA pool: full-layer tokens = rest / (F + r x S) with r = swa_full_tokens_ratio.
            tokens = int(rest // (full + SWA_FULL_TOKENS_RATIO * sliding))
        else:
            tokens = int(rest // cell) if cell else 0
        return Limits(int(kv_bytes), tokens, tokens, tokens / context_len)

    return limits, cell, state


def online_fp8_refusal(ctx: Context, room: int) -> list[str]:
    """Online FP8 whose load (the bf16 model plus the FP8 copies made) cannot fit in *room*: SGLang OOMs loading."""
    load = online_fp8_load(ctx)
    if load is None or load.peak_bytes <= room:
        return []
    return [
        f"online FP8 loads the checkpoint in {ctx.dtype} before quantizing: the load reserves "
        f"{gib(load.peak_bytes, unit=True)} per GPU, {gib(room, unit=True)} are free after the CUDA context"
        " and NCCL (use an FP8 checkpoint or more GPUs)"
    ]


def _short_pool_note(tokens: int, context_len: int) -> list[str]:
    if 0 < tokens < context_len:
        return [
            f"the pool holds {tokens:,} tokens, fewer than the {context_len:,}-token context: SGLang starts and caps "
            f"each request at {tokens - 1:,} tokens (max_req_len)"
        ]
    return []


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("SGLang")
    settings = ctx.settings
    chunk_default, graph_bs_default = gpu_defaults(ctx)
    chunk = settings.chunked_prefill_size or settings.max_num_batched_tokens or chunk_default
    graph_max_bs = settings.cuda_graph_max_bs or graph_bs_default
    fraction = (
        settings.mem_fraction_static
        or settings.gpu_memory_utilization
        or default_fraction(ctx, chunk, graph_max_bs)
    )
    if not 0 < fraction < 1:
        raise ConfigError(f"--mem-fraction-static must be in (0, 1), got {fraction}")
    context_len = settings.max_model_len or ctx.default_context
    if not context_len:
        raise ConfigError(
            f"the context length of {ctx.model.name} is unknown: pass --max-model-len "
            "(SGLang --context-length)"
        )
    components = static_components(ctx, chunk, graph_max_bs)
    total, other = ctx.total, ctx.other

    def free_at_init(parts: list[Component], point: str) -> int:
        return total - other - pick(parts, point, ("cuda_context", "nccl"))

    reserve = int(free_at_init(components, "mid") * (1 - fraction))

    def kv_rule(parts: list[Component], point: str) -> int:
        # free after weights (min over ranks), less the share of the free-at-init memory kept back.
        at_init = free_at_init(parts, point)
        return at_init - pick(parts, point, ("weights",)) - int(at_init * (1 - fraction))

    limits, cell, state = token_limits(ctx, context_len)
    max_running = sglang_max_running(limits(kv_rule(components, "mid")).kv_cache_tokens, context_len)
    requests = settings.max_num_seqs or max_running
    # ReqToTokenPool: an int32 row of context_len + 4 token slots per request slot (max_num_reqs + 1),
    # allocated right after the KV pool, inside the (1 - fraction) reserve (model_runner init_memory_pool).
    components.append(
        band(
            "req_to_token_pool",
            (requests + 1) * (context_len + 4) * 4,
            0.01,
            0.01,
            ENGINE,
            f"int32 token map of {requests + 1} request slots x {context_len + 4} positions",
            in_budget=False,
        )
    )
    outside = sum(c.bytes for c in components if not c.in_budget)
    reasons = online_fp8_refusal(ctx, free_at_init(components, "mid"))
    if outside > reserve:
        reasons.append(
            f"activations, CUDA graphs and the request-to-token map ({gib(outside, unit=True)}) exceed the "
            f"{gib(reserve, unit=True)} that mem_fraction_static {fraction} leaves: lower it"
        )
    return PolicyResult(
        components=components,
        budget_bytes=total - other - reserve,
        kv_rule=kv_rule,
        limits=limits,
        max_model_len=context_len,
        block_size=1,
        kv_bytes_per_token=cell,
        settings={
            "mem_fraction_static": fraction,
            "chunked_prefill_size": chunk,
            "cuda_graph_max_bs": graph_max_bs,
            "context_length": context_len,
            "max_running_requests": requests,
            "tp_size": ctx.tp,
            "pp_size": ctx.pp,
            "dtype": ctx.dtype,
            "kv_cache_dtype": settings.kv_cache_dtype,
        },
        kv_provenance=ENGINE,
        kv_note=f"free memory after weights less (1 - {fraction}) x the memory free at start-up, "
        f"in cells of {cell} bytes",
        per_sequence_state_bytes=state,
        reasons=reasons,
        notes=[
            f"mem_fraction_static {fraction} keeps {gib(reserve, unit=True)} for activations, CUDA graphs and runtime"
        ]
        + _short_pool_note(limits(kv_rule(components, "mid")).kv_cache_tokens, context_len),
        # The scheduler does not refuse a pool shorter than the context: it caps a request at
        # min(context_len, max_total_num_tokens) - 1 tokens (scheduler.py `max_req_len`) and asserts only that
        # this leaves room (> 5 tokens of input).
        min_blocks_needed=7,
        extra={"cell_size_bytes": cell, "reserved_bytes": reserve},
    )
