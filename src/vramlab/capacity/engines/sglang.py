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
HYBRID_SWA_ARCHS = frozenset({"Llama4ForConditionalGeneration", "GptOssForCausalLM", "MiMoV2FlashForCausalLM",
                              "Step3p5ForCausalLM", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"})
HYBRID_SWA_FROM = (0, 4, 9)  # PR #7367 (July 2025 CI runs); the first release is not pinned
GPT_OSS_HYBRID_AFTER = (0, 5, 8)  # disabled by server_args up to at least January 2026 (PR #17630's repro)
CONTEXT_EXTRA_BAND = 0.5  # SGLang's CUDA context is not measured apart from vLLM's: unknown term, band widened


def weight_tensor_sizes(ctx: Context) -> list[int] | None:
    """Bytes of each weight tensor one TP rank allocates, in creation order (embedding, then per layer
    qkv_proj + bias, o_proj, gate_up_proj / fused-MoE w13 + w2 and router, norms; then the LM head),
    for plain attention decoders; None where the layout is not modelled (MLA, SSM, vision towers)."""
    m, tp = ctx.model, ctx.tp
    if m.is_mla or m.vision_params or ctx.pp > 1 or any(k not in ("full", "sliding") for k in m.kinds[: m.num_layers]):
        return None
    unq = dtype_bytes(ctx.dtype)
    lin = ctx.quant.bits / 8 if ctx.quant is not None else unq  # the packed weight; its scales are own small tensors
    h, hd = m.hidden_size, m.head_dim
    q_dim = m.num_attention_heads // tp * hd
    kv_dim = max(1, m.num_kv_heads // tp) * hd
    vocab = -(-m.vocab_size // wmod.VOCAB_PADDING) * wmod.VOCAB_PADDING // tp
    sizes = [int(vocab * h * unq)]
    moe = set(m.moe_layer_indices())
    for i in range(m.num_layers):
        sizes.append(int((q_dim + 2 * kv_dim) * h * lin))
        if m.attention_bias:
            sizes.append(int((q_dim + 2 * kv_dim) * unq))
        sizes.append(int(q_dim * h * lin))
        if i in moe:
            inter = m.moe_intermediate_size // tp
            sizes += [int(m.num_experts * 2 * inter * h * lin), int(m.num_experts * inter * h * lin),
                      int(m.num_experts * h * unq)]
            if m.num_shared_experts and m.shared_expert_intermediate_size:
                shared = m.shared_expert_intermediate_size // tp
                sizes += [int(2 * shared * h * lin), int(shared * h * lin)]
        elif m.intermediate_size:
            inter = m.intermediate_size // tp
            sizes += [int((2 if m.gated_mlp else 1) * inter * h * lin), int(inter * h * lin)]
        sizes += [int(h * unq), int(h * unq)]
    if not m.tie_word_embeddings:
        sizes.append(int(vocab * h * unq))
    return sizes


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
    if not sizes and not absorbed:
        return weights
    extra = allocator.rounding_bytes(sizes) if sizes else 0
    note = weights.note
    if extra:
        note += f"; + {gib(extra, unit=True)} of allocator segment rounding (SGLang reads free memory)"
    if absorbed:
        note += f"; + {gib(absorbed, unit=True)} of MLA w_kc/w_vc copies (post_load_weights)"
    return band("weights", weights.bytes + extra + absorbed, 0.0, 0.0, weights.provenance, note,
                abs_low=weights.bytes - weights.low_bytes + extra + absorbed // 2,
                abs_high=weights.high_bytes - weights.bytes)


def static_components(ctx: Context, chunk: int, graph_max_bs: int) -> list[Component]:
    """Context, NCCL and weights (inside the static pool), then what the reservation must hold."""
    model, settings, constants = ctx.model, ctx.settings, ctx.constants
    components: list[Component] = [
        # vLLM 0.19's figure: SGLang's own context before NCCL init is not pinned (one ~0.4.3 log on an L4:
        # 22.49 GiB card, "avail mem=21.63" after an NCCL init of 0.13, i.e. 0.73 GiB) -> band widened.
        ctx.constant_component("cuda_context", "cuda_context_bytes",
                               "CUDA context and library handles (unknown term, band widened: vLLM's figure; "
                               "an SGLang 0.4 log on an L4 showed 0.73 GiB)", extra_band=CONTEXT_EXTRA_BAND),
    ]
    if ctx.tp * ctx.pp > 1:
        components.append(ctx.nccl_component("NCCL communicators"))
    components.append(weights_as_reported(ctx))
    # Outside the static pool, inside the (1 - fraction) reservation.
    activation = forward_peak_bytes(model, chunk, ctx.tp, ctx.dtype, constants) \
        + moe_workspace_bytes(model, chunk, ctx.tp, ctx.dtype, constants) \
        + 4 * graph_max_bs * model.vocab_size  # fp32 logits of a full decode batch
    names = ("forward_intermediate_copies", "forward_hidden_copies")
    rel = constants.band(*names) + 0.2
    components.append(band("activation_peak", activation, rel, rel, constants.provenance(*names),
                           f"prefill chunk of {chunk} tokens and decode logits for {graph_max_bs} requests",
                           in_budget=False))
    graphs = 0.0 if settings.enforce_eager else constants["sglang_graph_bytes_per_bs"] * graph_max_bs
    if graphs:
        key = "sglang_graph_bytes_per_bs"
        components.append(band("cuda_graphs", graphs, constants.band(key), constants.band(key),
                               constants.provenance(key),
                               f"decode graphs up to batch {graph_max_bs}, captured after the pool", in_budget=False))
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


def _short_pool_note(tokens: int, context_len: int) -> list[str]:
    if 0 < tokens < context_len:
        return [f"the pool holds {tokens:,} tokens, fewer than the {context_len:,}-token context: SGLang starts and caps "
                f"each request at {tokens - 1:,} tokens (max_req_len)"]
    return []


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("SGLang")
    settings = ctx.settings
    chunk_default, graph_bs_default = gpu_defaults(ctx)
    chunk = settings.chunked_prefill_size or settings.max_num_batched_tokens or chunk_default
    graph_max_bs = settings.cuda_graph_max_bs or graph_bs_default
    fraction = settings.mem_fraction_static or settings.gpu_memory_utilization \
        or default_fraction(ctx, chunk, graph_max_bs)
    if not 0 < fraction < 1:
        raise ConfigError(f"--mem-fraction-static must be in (0, 1), got {fraction}")
    context_len = settings.max_model_len or ctx.default_context
    if not context_len:
        raise ConfigError(f"the context length of {ctx.model.name} is unknown: pass --max-model-len "
                          "(SGLang --context-length)")
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
    components.append(band("req_to_token_pool", (requests + 1) * (context_len + 4) * 4, 0.01, 0.01, ENGINE,
                           f"int32 token map of {requests + 1} request slots x {context_len + 4} positions",
                           in_budget=False))
    outside = sum(c.bytes for c in components if not c.in_budget)
    reasons = []
    if outside > reserve:
        reasons.append(f"activations, CUDA graphs and the request-to-token map ({gib(outside, unit=True)}) exceed the "
                       f"{gib(reserve, unit=True)} that mem_fraction_static {fraction} leaves: lower it")
    return PolicyResult(
        components=components, budget_bytes=total - other - reserve, kv_rule=kv_rule, limits=limits,
        max_model_len=context_len, block_size=1, kv_bytes_per_token=cell,
        settings={"mem_fraction_static": fraction, "chunked_prefill_size": chunk, "cuda_graph_max_bs": graph_max_bs,
                  "context_length": context_len, "max_running_requests": requests,
                  "tp_size": ctx.tp, "pp_size": ctx.pp, "dtype": ctx.dtype, "kv_cache_dtype": settings.kv_cache_dtype},
        kv_provenance=ENGINE,
        kv_note=f"free memory after weights less (1 - {fraction}) x the memory free at start-up, "
                f"in cells of {cell} bytes",
        per_sequence_state_bytes=state, reasons=reasons,
        notes=[f"mem_fraction_static {fraction} keeps {gib(reserve, unit=True)} for activations, CUDA graphs and runtime"]
        + _short_pool_note(limits(kv_rule(components, "mid")).kv_cache_tokens, context_len),
        # The scheduler does not refuse a pool shorter than the context: it caps a request at
        # min(context_len, max_total_num_tokens) - 1 tokens (scheduler.py `max_req_len`) and asserts only that
        # this leaves room (> 5 tokens of input).
        min_blocks_needed=7, extra={"cell_size_bytes": cell, "reserved_bytes": reserve},
    )
