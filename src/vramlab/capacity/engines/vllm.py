"""vLLM's memory policy, by era (docs/research/capacity-anchors.md §1; the era tables and the settings vLLM
resolves before profiling are in vllm_eras.py).

- Budget: `gpu_memory_utilization x total` of the WHOLE card (or `--kv-cache-memory`).
- KV = budget - (weights + activation peak + non-torch increase) [- CUDA-graph estimate, V1 >= 0.20]; from 0.27 the
  weights and non-torch terms are read together off cudaMemGetInfo ("consumed memory"), which also charges torch
  buffers outside the weights and the allocator's unreleasable cache (single-card logs: what 0.19 planned; TP/PP over
  PCIe: more, not pinned, band widened).
- V1 (default from 0.8): before 0.9.1 the budget takes off everything on the card beyond torch's
  allocations (CUDA context and NCCL included); from 0.9.1 a baseline snapshot after the CUDA
  context leaves the context outside the budget, and from 0.11.0 the snapshot also follows NCCL init;
  graphs captured after the KV allocation (< 0.20) must fit in the `1 - util` headroom.
- V1's profiled sampler sorts the vocabulary (~39 B per sequence and vocab entry) unless a
  sort-free path runs: FlashInfer (when importable before 0.11.1, opt-in 0.11.1-0.21, default
  from 0.22) or the Triton top-k/top-p of 0.17+ (~15 B).
- V0 profiles inside one window: NCCL init and the custom all-reduce buffers are part of its
  `non_torch_memory`, which therefore follows the interconnect (PCIe vs NVSwitch).
- V0 turns chunked prefill on by itself above a 32k context, which caps the profiled tokens.
- Blocks are the minimum over ranks; concurrency = blocks / blocks one max_model_len request needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from vramlab.capacity import devices, pool
from vramlab.capacity.defaults import vllm_window_off
from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.engines.vllm_activation import activation_component, stage0_encoder
from vramlab.capacity.engines.vllm_eras import (
    CONSUMED_BEYOND_WEIGHTS_SEEN,
    NCCL_BEFORE_SNAPSHOT_FROM,
    PP_PCIE_UNEXPLAINED_SEEN,
    PRE_AMPERE,
    TOKENS_AS_CONCURRENCY_FROM,
    TOTAL_CONSUMED_FROM,
    UNKNOWN_TERM_BAND,
    Setup,
    nvls,
    resolve_setup,
    v0_mla_absorbs,
)
from vramlab.capacity.engines.vllm_mm import EncoderProfile
from vramlab.capacity.estimate import DEFAULT, ENGINE, Component, Limits, band
from vramlab.capacity.kv import KVShape
from vramlab.capacity.overheads import (
    cuda_graph_bytes,
    vllm_capture_sizes,
)
from vramlab.capacity.spec import dtype_bytes
from vramlab.units import gib


def mla_absorbed_bytes(ctx: Context, stage: int) -> int:
    """Per GPU: what V0 0.7.x MLA adds to the weights after loading, per layer and rank: W_QR (activation dtype),
    W_Q_UK and W_UV_O (requantized to FP8 for FP8 weights, else activation dtype) and, for FP8 weights, the
    dequantized kv_b_proj that W_UK/W_UV keep alive."""
    m = ctx.model
    heads = m.num_attention_heads // ctx.tp
    act = int(dtype_bytes(ctx.dtype))
    fp8 = ctx.quant is not None and "fp8" in ctx.quant.method
    absorbed = 1 if fp8 else act
    q_in, latent, rope = m.q_lora_rank or m.hidden_size, m.kv_lora_rank or 0, m.qk_rope_head_dim or 0
    per_layer = (
        q_in * heads * rope * act
        + q_in * heads * latent * absorbed
        + heads * latent * m.hidden_size * absorbed
    )
    if fp8:
        per_layer += latent * heads * ((m.qk_nope_head_dim or 0) + (m.mla_v_head_dim or 0)) * act
    return per_layer * len(ctx.layer_range(stage))


def weights_with_absorption(ctx: Context, stage: int) -> Component:
    weights = ctx.weights_component(stage)
    extra = mla_absorbed_bytes(ctx, stage)
    return Component(
        weights.name,
        weights.bytes + extra,
        weights.low_bytes + extra,
        weights.high_bytes + extra,
        weights.provenance,
        weights.note + f"; plus {gib(extra, unit=True)} of absorbed MLA matrices "
        "V0 0.7.x builds after loading (W_Q_UK, W_UV_O, W_QR)",
    )


def non_torch_key(ctx: Context, setup: Setup) -> str:
    if setup.mode == "v0":
        if not setup.multi_gpu:
            return "v0_non_torch_bytes"
        return "v0_non_torch_tp_nvswitch_bytes" if ctx.tp > 1 and ctx.on_nvswitch else "v0_non_torch_tp_bytes"
    if ctx.tp > 1:
        return "non_torch_forward_tp_bytes" if nvls(ctx) else "non_torch_forward_tp_nonvls_bytes"
    if ctx.pp > 1:
        return "non_torch_forward_pp_bytes"
    return "non_torch_forward_bytes"


def counts_total_consumed(ctx: Context, setup: Setup) -> bool:
    """V1 0.27+: the budget charges everything cudaMemGetInfo saw consumed since the init snapshot."""
    return setup.mode == "v1" and ctx.version is not None and ctx.version >= TOTAL_CONSUMED_FROM


def non_torch_component(ctx: Context, setup: Setup) -> Component:
    key = non_torch_key(ctx, setup)
    if setup.mode == "v0" and setup.multi_gpu:
        what = " (NCCL init and custom all-reduce buffers, inside V0's profiling window; " + (
            "NVSwitch node)" if "nvswitch" in key else "PCIe / no NVSwitch)"
        )
    else:
        what = " (custom all-reduce / NCCL buffers)" if ctx.tp > 1 else " (cuBLAS/Triton workspaces)"
    part = ctx.constant_component(
        "non_torch",
        key,
        "memory outside PyTorch that grows during profiling" + what,
        extra_band=UNKNOWN_TERM_BAND if setup.unknown_terms else 0.0,
    )
    # Unknown terms of the era: the value stays the measured constant, the high end reaches what logs of the era left.
    seen = 0.0
    note = part.note
    if counts_total_consumed(ctx, setup):
        note += (
            "; from 0.27 read with the weights off cudaMemGetInfo (mem_utils total_consumed), which also charges "
            "torch buffers outside the weights and the allocator's unreleasable cache"
        )
        if ctx.tp > 1 and not nvls(ctx):
            seen = max(seen, CONSUMED_BEYOND_WEIGHTS_SEEN - part.bytes)
    if (
        setup.mode == "v1"
        and ctx.pp > 1
        and not ctx.on_nvswitch
        and ctx.version
        and ctx.version >= NCCL_BEFORE_SNAPSHOT_FROM
    ):
        seen = max(seen, PP_PCIE_UNEXPLAINED_SEEN)
    if seen:
        note += "; band widened up to what logs of this era and interconnect left (unknown term)"
    cache = devices.page_cache_band_bytes(ctx.gpu, ctx.settings, ctx.weights()[0])
    if cache:
        seen += cache
        note += "; on unified memory up to the checkpoint's size more: page cache read in while loading is MemFree gone"
    return Component(
        part.name,
        part.bytes,
        part.low_bytes,
        int(part.high_bytes + seen),
        part.provenance,
        note,
        part.in_budget,
    )


def graphs_component(ctx: Context, setup: Setup, stage: int) -> Component:
    constants = ctx.constants
    layers_local = len(ctx.layer_range(stage))
    graphs = cuda_graph_bytes(ctx.model, layers_local, vllm_capture_sizes(setup.max_num_seqs), constants)
    if setup.graphs_in_budget:
        graphs *= constants["cuda_graph_estimate_ratio"]
    names = ("cuda_graph_base_bytes", "cuda_graph_per_layer_bytes")
    rel = constants.band(*names) + (UNKNOWN_TERM_BAND if setup.unknown_terms else 0.0)
    where = (
        "; estimated during profiling and taken from the budget (V1 >= 0.20)"
        if setup.graphs_in_budget
        else "; captured after the KV cache is allocated, so it must fit in the 1 - util headroom"
    )
    return band(
        "cuda_graphs",
        graphs,
        rel,
        rel,
        constants.provenance(*names),
        "CUDA graph pool for decode batch sizes" + where,
        in_budget=setup.graphs_in_budget,
    )


def stage_components(
    ctx: Context, setup: Setup, stage: int, enc: EncoderProfile | None = None
) -> list[Component]:
    """Everything but the KV cache on one pipeline stage's GPU."""
    components = [
        ctx.constant_component(
            "cuda_context",
            "cuda_context_bytes",
            "CUDA context and library handles, before vLLM's baseline snapshot"
            if setup.context_outside_budget
            else "CUDA context and library handles: V1 before 0.9.1 counts every non-torch byte on the card in its budget",
            in_budget=not setup.context_outside_budget,
        )
    ]
    if setup.multi_gpu and setup.mode == "v1":
        components.append(
            ctx.nccl_component(
                "NCCL communicators created at start-up"
                + (
                    "; outside the budget since V1 inits them before the snapshot"
                    if setup.nccl_outside_budget
                    else "; inside the profiling window"
                ),
                in_budget=not setup.nccl_outside_budget,
            )
        )
    components.append(
        weights_with_absorption(ctx, stage)
        if setup.mode == "v0" and v0_mla_absorbs(ctx)
        else ctx.weights_component(stage)
    )
    components.append(
        activation_component(
            ctx,
            setup,
            last_stage=stage == ctx.pp - 1,
            first_stage=stage == 0,
            enc=enc if stage == 0 else None,
        )
    )
    components.append(non_torch_component(ctx, setup))
    if not ctx.settings.enforce_eager:
        components.append(graphs_component(ctx, setup, stage))
    return components


@dataclass(frozen=True)
class PoolPlan:
    """The KV pool's layout on every pipeline stage."""

    layouts: list[pool.PoolLayout]
    bytes_per_token: list[int]
    block_size: int
    state_bytes_per_seq: int


def recurrent_state_dtype(ctx: Context) -> str:
    """vLLM's gated-delta-net state dtype (MambaStateDtypeCalculator.gated_delta_net_state_dtype, 0.10.2-0.27):
    the conv dtype -- the model's, `--mamba-cache-dtype auto` -- for the recurrent state too, unless
    `--mamba-ssm-cache-dtype` says otherwise (Qwen3.5's config hook reads its `mamba_ssm_dtype` from 0.19).
    Qwen3-Next at TP 2 on 0.10.2 logs the 544-token attention block this gives."""
    if ctx.model.mamba_ssm_dtype and (not ctx.version or ctx.version >= (0, 19)):
        return ctx.model.mamba_ssm_dtype
    return ctx.dtype


def pool_plan(ctx: Context, hybrid_manager: bool) -> PoolPlan:
    """Per stage: the KV shapes grouped as the hybrid manager groups them; vLLM grows the attention
    block until its page is at least the Mamba page."""
    block_size = ctx.settings.block_size or 16
    windowless = vllm_window_off(ctx.model, ctx.version, ctx.settings.disable_sliding_window)
    stages = []
    for stage in range(ctx.pp):
        shapes = full_attention_only(ctx.kv_shapes(stage)) if windowless else ctx.kv_shapes(stage)
        kinds = ctx.model.kinds
        state_layers = sum(1 for i in ctx.layer_range(stage) if kinds[i] in ("mamba", "linear"))
        state = ctx.state_bytes_per_seq(stage, recurrent_state_dtype(ctx))
        state_per_layer = state // max(1, state_layers) if state_layers else 0
        if state_layers and shapes and not ctx.settings.block_size:
            attn_per_token = max(shape.bytes_per_token_layer for shape in shapes)
            block_size = 16 * math.ceil(state_per_layer / (16 * attn_per_token))
        stages.append((shapes, state_layers, state_per_layer))
    layouts = [
        pool.layout(shapes, block_size, n, per_layer, hybrid_manager=hybrid_manager)
        for shapes, n, per_layer in stages
    ]
    per_token = [
        sum(shape.layers * shape.bytes_per_token_layer for shape in shapes) for shapes, _, _ in stages
    ]
    return PoolPlan(layouts, per_token, block_size, ctx.state_bytes_per_seq(0, recurrent_state_dtype(ctx)))


def full_attention_only(shapes: tuple[KVShape, ...]) -> tuple[KVShape, ...]:
    """The window off: get_kv_cache_spec gives sliding layers a FullAttentionSpec (no window), so they join the full
    layers of the same page size in one group and each holds max_model_len tokens."""
    merged: dict[int, int] = {}
    for shape in shapes:
        if shape.kind in ("full", "sliding"):
            merged[shape.bytes_per_token_layer] = merged.get(shape.bytes_per_token_layer, 0) + shape.layers
    rest = tuple(shape for shape in shapes if shape.kind not in ("full", "sliding"))
    return tuple(KVShape("full", layers, per) for per, layers in merged.items()) + rest


def limits_rule(
    ctx: Context, setup: Setup, pools: PoolPlan, stage_offsets: list[int], blocks_per_request: int
) -> Callable[[int], Limits]:
    """KV bytes -> blocks (the minimum over stages), tokens and concurrency as this era reports them."""
    first = pools.layouts[0]
    hybrid = first.num_groups > 1
    length, block_size, version = setup.max_model_len, pools.block_size, ctx.version

    def limits(kv_bytes: int) -> Limits:
        blocks = min(
            pool.num_blocks(max(0, kv_bytes + offset), layout)
            for offset, layout in zip(stage_offsets, pools.layouts, strict=True)
        )
        if setup.mode == "v0":
            return Limits(int(kv_bytes), blocks * block_size, blocks, blocks * block_size / length)
        concurrency = blocks / blocks_per_request
        if hybrid and version and version >= TOKENS_AS_CONCURRENCY_FROM:
            tokens = int(concurrency * length)
        elif hybrid:
            tokens = blocks // first.num_groups * block_size
        else:
            tokens = blocks * block_size
        return Limits(int(kv_bytes), int(tokens), int(blocks), concurrency)

    return limits


def start_up_refusals(ctx: Context, setup: Setup, components: list[Component], budget: int) -> list[str]:
    """V1 refuses to start when the card's free memory is below util x total."""
    if setup.mode != "v1" or ctx.settings.kv_cache_memory_bytes or not setup.context_outside_budget:
        return []  # V1 before 0.9.1 has no start-up check (no snapshot in gpu_worker.init_device)
    outside = ("cuda_context", "nccl") if setup.nccl_outside_budget else ("cuda_context",)
    free_at_start = ctx.total - ctx.other - sum(c.bytes for c in components if c.name in outside)
    if free_at_start >= budget:
        return []
    return [
        f"Free memory on device ({gib(free_at_start)}/{gib(ctx.total, unit=True)}) on startup is less than "
        f"desired GPU memory utilization ({setup.utilization}, {gib(budget, unit=True)})"
    ]


def plan_notes(ctx: Context, setup: Setup, first_layout: pool.PoolLayout) -> list[str]:
    notes = ctx.longer_than_trained(
        setup.max_model_len,
        "vLLM",
        ctx.settings.allow_long_max_model_len or bool(ctx.settings.rope_scaling_factor),
        "vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (--allow-long-max-model-len) or a "
        "rope-scaling override (--rope-scaling-factor) extends the context",
    )
    window_off = vllm_window_off(ctx.model, ctx.version, ctx.settings.disable_sliding_window)
    if window_off:
        notes.append(
            f"sliding window off ({window_off}): every layer is full attention, holding max_model_len "
            f"tokens, and the derived context is capped at the window ({ctx.model.sliding_window:,})"
        )
    if first_layout.padded_layers:
        waste = first_layout.padded_layers / max(1, first_layout.num_groups * first_layout.group_size)
        notes.append(
            f"hybrid KV groups: {first_layout.padded_layers} padding layer slots "
            f"(up to {waste:.1%} of the pool unused), as vLLM logs 'Add N padding layers'"
        )
    if not setup.graphs_in_budget and not ctx.settings.enforce_eager:
        notes.append("CUDA graphs are captured after the KV cache exists: they need the 1 - util headroom")
    if setup.mode == "v0" and setup.chunked_prefill and not ctx.settings.max_num_batched_tokens:
        notes.append(
            f"V0 enables chunked prefill above a 32k context: the profile runs {setup.profile_tokens} "
            f"tokens, not {setup.max_model_len}"
        )
    if ctx.gpu.arch in PRE_AMPERE:
        backend = "XFormers" if setup.mode == "v0" else "a Triton/FlexAttention backend"
        notes.append(
            f"{ctx.gpu.arch.title()} has no FlashAttention 2: vLLM {setup.mode.upper()} uses {backend}"
            + ("; float16 instead of the config's bfloat16" if ctx.model.torch_dtype == "bfloat16" else "")
        )
    if not setup.sampler_path_known:
        notes.append(
            f"vLLM {ctx.settings.resolved_version} profiles the sampler with FlashInfer when it is installed "
            "(the docker image) and by sorting the vocabulary otherwise (pip without the flashinfer extra): "
            "planned as the sort, band widened to FlashInfer's; pass --flashinfer-sampler on|off"
        )
    notes += [f"unknown term, band widened: {why}" for why in setup.unknown_terms]
    if ctx.settings.limit_mm_per_prompt and ctx.model.vision is None and not ctx.model.vision_params:
        notes.append(  # vLLM reads the limits only for a model with a multimodal processor
            "--limit-mm-per-prompt changes nothing here: the model takes text only (no vision tower)"
        )
    return notes


def stage_notes(ctx: Context, pools: PoolPlan, kv_first: int, offsets: list[int]) -> list[str]:
    """Which pipeline stage bounds the pool: every worker gets the smallest worker's block count
    (vllm/v1/core/kv_cache_utils.py `get_kv_cache_configs`: `min_num_blocks`, 0.27.1/0.28.0; tensors shrunk to it)."""
    if ctx.pp < 2:
        return []
    kv = [kv_first + offset for offset in offsets]
    blocks = [pool.num_blocks(max(0, k), layout) for k, layout in zip(kv, pools.layouts, strict=True)]
    tight = min(range(ctx.pp), key=lambda i: blocks[i])
    role = (
        "the last stage: lm_head and the sampler's profile peak"
        if tight == ctx.pp - 1
        else "the first stage: the embedding"
        if tight == 0
        else "a middle stage: the most layers"
    )
    return [
        f"pipeline parallel: stage {tight + 1} of {ctx.pp} bounds the pool ({role}); its own budget leaves "
        f"{gib(kv[tight], unit=True)} for KV against {gib(kv[0], unit=True)} on stage 1, and vLLM gives every stage "
        f"its {blocks[tight]} blocks"
    ]


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("vLLM")
    setup = resolve_setup(ctx)
    settings = ctx.settings
    enc = stage0_encoder(ctx, setup)
    stages = [stage_components(ctx, setup, stage, enc) for stage in range(ctx.pp)]
    components = stages[0]
    fixed_kv = settings.kv_cache_memory_bytes
    budget = int(fixed_kv if fixed_kv else setup.utilization * ctx.total)
    # V1 before 0.9.1 charges every non-torch byte on the card to the budget (vllm_eras.V1_SNAPSHOT_FROM), other
    # processes' included; from 0.9.1 (and in V0) only what changes after the start-up snapshot counts.
    held = ctx.other if setup.mode == "v1" and not setup.context_outside_budget else 0

    def kv_rule(parts: list[Component], point: str) -> int:
        return int(fixed_kv) if fixed_kv else budget - held - pick(parts, point)

    pools = pool_plan(ctx, hybrid_manager=setup.mode == "v1")
    first = pools.layouts[0]
    # A later stage's KV = stage 0's KV + the difference of their in-budget components.
    offsets = [pick(components, "mid") - pick(stage, "mid") for stage in stages]
    blocks_per_request = pool.blocks_per_request(
        first,
        setup.max_model_len,
        setup.profile_tokens,
        ctx.model.sliding_window,
        ctx.model.attention_chunk_size,
    )
    resolved = {
        "engine_mode": setup.mode,
        "gpu_memory_utilization": setup.utilization,
        "max_num_seqs": setup.max_num_seqs,
        "max_num_batched_tokens": setup.profile_tokens,
        "max_model_len": setup.max_model_len,
        "block_size": pools.block_size,
        "tensor_parallel_size": ctx.tp,
        "pipeline_parallel_size": ctx.pp,
        "dtype": ctx.dtype,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "quantization": ctx.quant.method if ctx.quant else None,
        "enforce_eager": settings.enforce_eager,
        "kv_cache_memory_bytes": fixed_kv,
        "chunked_prefill": setup.chunked_prefill,
        "sampler": setup.sampler_path
        if setup.sampler_path_known
        else f"{setup.sampler_path} (or flashinfer if installed)",
    }
    return PolicyResult(
        components=components,
        budget_bytes=budget,
        kv_rule=kv_rule,
        limits=limits_rule(ctx, setup, pools, offsets, blocks_per_request),
        max_model_len=setup.max_model_len,
        block_size=pools.block_size,
        kv_bytes_per_token=pools.bytes_per_token[0],
        settings=resolved,
        kv_provenance=ENGINE if not fixed_kv else DEFAULT,
        kv_note=(
            "--kv-cache-memory: fixed by the user"
            if fixed_kv
            else f"util x total ({setup.utilization} x {gib(ctx.total, unit=True)}) less the in-budget components"
        ),
        per_sequence_state_bytes=pools.state_bytes_per_seq,
        reasons=start_up_refusals(ctx, setup, components, budget),
        notes=plan_notes(ctx, setup, first)
        + ([] if fixed_kv else stage_notes(ctx, pools, kv_rule(components, "mid"), offsets)),
        min_blocks_needed=blocks_per_request,
        extra={
            "blocks_per_request": blocks_per_request,
            "hybrid_groups": [list(g) for g in first.groups],
            **({"encoder_profile": enc.to_json()} if enc else {}),
        },
    )
