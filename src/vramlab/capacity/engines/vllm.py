"""vLLM's memory policy, by era (research/capacity-anchors.md §1).

- Budget: `gpu_memory_utilization x total` of the WHOLE card (or `--kv-cache-memory`).
- KV = budget - (weights + activation peak + non-torch increase) [- CUDA-graph estimate, V1 >= 0.20].
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
from dataclasses import dataclass

from vramlab.capacity import pool
from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.estimate import DEFAULT, ENGINE, GIB, Component, Limits, band
from vramlab.capacity.overheads import (
    cuda_graph_bytes,
    forward_peak_bytes,
    moe_workspace_bytes,
    sampler_peak_bytes,
    vllm_capture_sizes,
)
from vramlab.capacity.spec import dtype_bytes
from vramlab.errors import ConfigError

V1_DEFAULT_FROM = (0, 8)
V0_REMOVED_IN = (0, 11)
# vllm/v1/worker/gpu_worker.py `init_device`: 0.9.1 takes `self.init_snapshot = MemorySnapshot()` (after the
# CUDA context); 0.8.x-0.9.0 `determine_available_memory` instead adds every non-torch byte on the card
# (`non_torch_allocations = total_allocated_bytes - torch_allocated_bytes`), the context included.
V1_SNAPSHOT_FROM = (0, 9, 1)
# The snapshot precedes `init_worker_distributed_environment` in 0.9.1-0.10.2 (NCCL inside the budget's
# non-torch increase) and follows it from 0.11.0 (NCCL outside).
NCCL_BEFORE_SNAPSHOT_FROM = (0, 11)
# The 0.20.0 wheel already ships both (its log calls the estimate "default since v0.21.0", the development name;
# 0.21.0 has no CUDA wheel): envs VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "1" (0.19: "0") and
# config/cache.py gpu_memory_utilization defaults to 0.92 (0.19: 0.9).
GRAPH_ESTIMATE_FROM = (0, 20)
UTIL_092_FROM = (0, 20)
V1_BATCH_BY_NAME_ONLY_FROM = (0, 8, 4)  # 0.8.0-0.8.3: `default_max_num_seqs = 1024` whatever the card
V1_BATCH_BY_MEMORY_FROM = (0, 8, 5)  # `device_memory >= 70 * GiB_bytes` replaces the H100/H200 name test
BATCH_DEFAULTS_BY_GPU_FROM = (0, 9)  # ... and A100 is excluded ("NOTE(Kuntai)", PR #17885)
TOKENS_AS_CONCURRENCY_FROM = (0, 27)
# V0 EngineArgs: `use_long_context = max_model_len > 32K` turns chunked prefill on (CUDA, no
# sliding window); the scheduler then profiles max_num_batched_tokens, 512 in the 0.6 series
# ("Chunked prefill is enabled with max_num_batched_tokens=512."), 2048 later.
V0_LONG_CONTEXT_ABOVE = 32 * 1024
V0_CHUNKED_BUDGET_2048_FROM = (0, 7)
# The oldest and newest releases whose terms come from logs or source of that era.
MODELLED_FROM, MODELLED_UP_TO = (0, 5), (0, 29, 99)
# V0 MLACommonImpl.process_weights_after_loading (vllm/attention/backends/mla/utils.py, 0.7.x) keeps
# "absorbed weights for decode and another copy of raw weights for prefill". MLA came to V0 in 0.7.1;
# which release dropped the absorption is not pinned, so 0.8+ V0 MLA keeps its band widened instead.
V0_MLA_ABSORPTION = ((0, 7, 1), (0, 8))
PRE_AMPERE = ("pascal", "volta", "turing")
# The V1 profile's dummy sampler (`_dummy_sampler_run`: top_p 0.9 and top_k vocab-1 on every sequence) takes
# one of three paths (vllm/v1/sample/ops/topk_topp_sampler.py): `apply_top_k_top_p` sorts the fp32 logits
# (values + int64 indices, softmax, cumsum, scatter); FlashInfer's top_k_top_p_sampling_from_logits and the
# Triton kernel of 0.17+ (`apply_top_k_top_p_triton` for batches >= 8) do not sort.
FLASHINFER_OPT_IN_FROM = (0, 11, 1)  # <= 0.11.0: `VLLM_USE_FLASHINFER_SAMPLER is not False` = on when importable;
# the wheel requires flashinfer-python only from 0.11.1 (before: the `flashinfer` extra, or the docker image)
TRITON_TOP_K_TOP_P_FROM = (0, 17)
FLASHINFER_SAMPLER_DEFAULT_FROM = (0, 22)  # envs.VLLM_USE_FLASHINFER_SAMPLER: bool = True (0.20: None = opt-in)
SORT_SAMPLER, FLASHINFER_SAMPLER, TRITON_SAMPLER = "sort", "flashinfer", "triton"
# The fused-MoE caches: per-call temporaries (fused_moe.py `cache13 = torch.empty(...)`), freed before the sampler
# runs, until 0.13.0 moved them into the persistent `current_workspace_manager()` (fused_moe/modular_kernel.py).
MOE_WORKSPACE_PERSISTS_FROM = (0, 13)
UNKNOWN_TERM_BAND = 0.5  # added to the band of a term whose value for this era/card is not measured


@dataclass(frozen=True)
class Setup:
    """The settings vLLM resolves before it profiles anything."""

    mode: str  # "v0" | "v1"
    utilization: float
    max_num_seqs: int
    profile_tokens: int  # max_num_batched_tokens: the dummy forward's batch
    max_model_len: int
    chunked_prefill: bool
    nccl_outside_budget: bool
    context_outside_budget: bool
    sampler_path: str  # "sort" | "flashinfer" | "triton": the profiled sampler's kernel
    sampler_path_known: bool  # False: which path runs depends on the install (band widened to the other)
    graphs_in_budget: bool
    multi_gpu: bool
    unknown_terms: tuple[str, ...]  # why bands are widened


def engine_kind(ctx: Context) -> str:
    version, asked = ctx.version, (ctx.settings.vllm_engine or "").lower()
    if asked == "v0" and version and version >= V0_REMOVED_IN:
        raise ConfigError(f"vLLM {ctx.settings.resolved_version} has no V0 engine (removed in 0.11; "
                          "leave out --engine-version to plan the last release that had it)")
    if asked in ("v0", "v1"):
        return asked
    return "v1" if not version or version >= V1_DEFAULT_FROM else "v0"


def defaults(ctx: Context, kind: str) -> tuple[float, int, int]:
    """(gpu_memory_utilization, max_num_seqs, max_num_batched_tokens) as vLLM would pick them."""
    settings, version = ctx.settings, ctx.version
    util = settings.gpu_memory_utilization or (0.92 if version and version >= UTIL_092_FROM else 0.9)
    if kind == "v0":
        seqs = settings.max_num_seqs or 256
        if v0_chunked_prefill(ctx):
            budget = 2048 if not version or version >= V0_CHUNKED_BUDGET_2048_FROM else 512
            return util, seqs, settings.max_num_batched_tokens or budget
        return util, seqs, settings.max_num_batched_tokens or max(context_length(ctx), 2048)
    big, seqs_big_anyway = v1_big_card(ctx)
    tokens_default = (8192 if settings.api_server else 16384) if big else (2048 if settings.api_server else 8192)
    seqs_default = 1024 if big or seqs_big_anyway else 256
    return util, settings.max_num_seqs or seqs_default, settings.max_num_batched_tokens or tokens_default


def v1_big_card(ctx: Context) -> tuple[bool, bool]:
    """(the larger batch defaults apply, max_num_seqs is 1024 on every card) as `EngineArgs._set_default_args_v1`
    of each release decides: 0.8.0-0.8.3 1024 sequences everywhere and the larger token budget on H100/H200 by
    device name; 0.8.4 both on H100/H200 only; 0.8.5 on cards of >= 70 GiB; 0.9.0 excludes A100 (PR #17885)."""
    version, gpu = ctx.version, ctx.gpu
    by_name = "h100" in gpu.name or "h200" in gpu.name
    if version and version < V1_BATCH_BY_NAME_ONLY_FROM:
        return by_name, True
    if version and version < V1_BATCH_BY_MEMORY_FROM:
        return by_name, False
    if version and version < BATCH_DEFAULTS_BY_GPU_FROM:
        return gpu.memory_gib >= 70, False
    return gpu.memory_gib >= 70 and not gpu.is_a100, False


def v0_chunked_prefill(ctx: Context) -> bool:
    """V0 turns chunked prefill on for contexts above 32k on CUDA models without a sliding window."""
    asked = ctx.settings.enable_chunked_prefill
    if asked is not None:
        return asked
    return (context_length(ctx) > V0_LONG_CONTEXT_ABOVE and ctx.gpu.vendor == "nvidia"
            and not ctx.model.sliding_window)


def context_length(ctx: Context) -> int:
    length = ctx.settings.max_model_len or ctx.model_max_len
    if not length:
        raise ConfigError(f"the context length of {ctx.model.name} is unknown (no max_position_embeddings "
                          "in its config): pass --max-model-len")
    return length


def sampler_path(ctx: Context, kind: str) -> tuple[str, bool]:
    """(the profiled sampler's path, whether the release alone decides it). `--flashinfer-sampler on|off`
    stands for VLLM_USE_FLASHINFER_SAMPLER / FlashInfer being installed; None = the release's default."""
    asked, version = ctx.settings.flashinfer_sampler, ctx.version or ()
    if kind == "v0":
        return SORT_SAMPLER, True  # V0's sampler sorts; FlashInfer only with VLLM_USE_FLASHINFER_SAMPLER=1
    without = TRITON_SAMPLER if not version or version >= TRITON_TOP_K_TOP_P_FROM else SORT_SAMPLER
    if asked is not None:
        return (FLASHINFER_SAMPLER if asked else without), True
    if version and version < FLASHINFER_OPT_IN_FROM:
        # FlashInfer runs whenever it is importable: a plain `pip install vllm` lacks it, the docker image has it.
        return SORT_SAMPLER, False
    if not version or version >= FLASHINFER_SAMPLER_DEFAULT_FROM:
        return FLASHINFER_SAMPLER, True
    return without, True


SAMPLER_KEYS = {SORT_SAMPLER: "legacy_sampler_bytes_per_seq_vocab",
                FLASHINFER_SAMPLER: "flashinfer_sampler_bytes_per_seq_vocab",
                TRITON_SAMPLER: "sampler_bytes_per_seq_vocab"}


def nvls(ctx: Context) -> bool:
    """NCCL NVLink-SHARP buffers exist on NVSwitch systems of Hopper and Blackwell cards."""
    gpu = ctx.gpu
    if ctx.settings.gpu_p2p is False:
        return False
    return gpu.arch in ("hopper", "blackwell") and "pcie" not in gpu.name and gpu.nominal_gb >= 80


def unknown_terms(ctx: Context, kind: str) -> tuple[str, ...]:
    """Eras and cards whose overhead terms no log of theirs has measured: their bands widen."""
    out = []
    version, gpu = ctx.version, ctx.gpu
    if version and version < MODELLED_FROM:
        out.append(f"vLLM {ctx.settings.resolved_version} predates the profiling of 0.5+ (no log of that era here)")
    if version and version > MODELLED_UP_TO:
        out.append(f"vLLM {ctx.settings.resolved_version} is newer than the newest release modelled (0.29)")
    if gpu.vendor == "amd":
        out.append("ROCm: HIP graphs, quick all-reduce and the ROCm attention backends are not measured")
    if gpu.arch in PRE_AMPERE and kind == "v1":
        out.append(f"V1 on {gpu.arch.title()}: its attention backend's profile peak is not measured")
    if ctx.settings.in_trainer:
        # Unsloth notebooks (vLLM inside GRPO trainers): KV off by -41 % to +100 % around a 0.3 % median elsewhere.
        out.append("vLLM inside a training process: the trainer's own allocations in the same process "
                   "(optimizer state, LoRA buffers, shared weights) are not modelled")
    multi_gpu = ctx.tp * ctx.pp > 1
    if kind == "v1" and multi_gpu and ctx.on_nvswitch and version and version < NCCL_BEFORE_SNAPSHOT_FROM:
        # Before 0.11 NCCL init and its NVLink/NVLS buffers fall inside V1's profiling window; their size is
        # measured on 0.19 H100 nodes (outside the window), not on a release of this era.
        out.append(f"V1 {ctx.settings.resolved_version} at TP/PP > 1 on an NVSwitch node: NCCL init counts against "
                   "the budget before 0.11, and its size (with the NVLink-SHARP buffers) is measured only on 0.19")
    if kind == "v1" and ctx.tp > 1 and not nvls(ctx) and version and version >= NCCL_BEFORE_SNAPSHOT_FROM:
        # non_torch_forward_tp_nonvls_bytes is read off 0.10 rows; 0.27.1 on 4 PCIe RTX PRO 6000 (r110) printed
        # 1.70 GiB of "consumed memory (weights + non-torch)" beyond its weights.
        out.append(f"V1 {ctx.settings.resolved_version} at TP > 1 without NVLink-SHARP: the non-torch growth is measured "
                   "on 0.10 only (0.15 GiB there; up to 1.7 GiB seen on 0.27 PCIe nodes)")
    if kind == "v0" and ctx.model.is_mla:
        # DeepSeek-R1 on 8x H200, V0 ~0.7.3: weights 83.88 GiB (headers 79.4), non-torch 7.16 GiB.
        out.append("V0 with MLA: the non-torch term at this size is not modelled" if v0_mla_absorbs(ctx) else
                   "V0 with MLA: the absorbed MLA matrices of this release and the non-torch term are not modelled")
    return tuple(out)


def v0_mla_absorbs(ctx: Context) -> bool:
    low, high = V0_MLA_ABSORPTION
    return ctx.model.is_mla and ctx.version is not None and low <= ctx.version < high


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
    per_layer = q_in * heads * rope * act + q_in * heads * latent * absorbed + heads * latent * m.hidden_size * absorbed
    if fp8:
        per_layer += latent * heads * ((m.qk_nope_head_dim or 0) + (m.mla_v_head_dim or 0)) * act
    return per_layer * len(ctx.layer_range(stage))


def weights_with_absorption(ctx: Context, stage: int) -> Component:
    weights = ctx.weights_component(stage)
    extra = mla_absorbed_bytes(ctx, stage)
    return Component(weights.name, weights.bytes + extra, weights.low_bytes + extra, weights.high_bytes + extra,
                     weights.provenance, weights.note + f"; plus {extra / GIB:.2f} GiB of absorbed MLA matrices "
                     "V0 0.7.x builds after loading (W_Q_UK, W_UV_O, W_QR)")


def resolve_setup(ctx: Context) -> Setup:
    kind = engine_kind(ctx)
    check_card(ctx, kind)
    util, seqs, tokens = defaults(ctx, kind)
    path, path_known = sampler_path(ctx, kind)
    if not 0 < util <= 1:
        raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    version = ctx.version
    return Setup(
        mode=kind, utilization=util, max_num_seqs=seqs, profile_tokens=tokens, max_model_len=context_length(ctx),
        chunked_prefill=kind == "v1" or v0_chunked_prefill(ctx),
        nccl_outside_budget=kind == "v1" and (not version or version >= NCCL_BEFORE_SNAPSHOT_FROM),
        context_outside_budget=kind == "v0" or not version or version >= V1_SNAPSHOT_FROM,
        sampler_path=path, sampler_path_known=path_known,
        graphs_in_budget=kind == "v1" and (not version or version >= GRAPH_ESTIMATE_FROM)
        and not ctx.settings.enforce_eager,
        multi_gpu=ctx.tp * ctx.pp > 1, unknown_terms=unknown_terms(ctx, kind))


def check_card(ctx: Context, kind: str) -> None:
    """vLLM's own refusals for a card: compute capability below 7.0, bf16 before Ampere."""
    gpu = ctx.gpu
    if gpu.arch == "pascal":
        raise ConfigError(f"vLLM needs compute capability 7.0 or newer; {gpu.name} (Pascal) is 6.x "
                          "(use llama.cpp, or a community Pascal build of vLLM)")
    if gpu.arch in PRE_AMPERE and ctx.settings.dtype in ("bfloat16", "bf16"):
        raise ConfigError(f"Bfloat16 is only supported on GPUs with compute capability of at least 8.0; "
                          f"{gpu.name} ({gpu.arch.title()}) is older: use --dtype half")


def later_flashinfer(ctx: Context, setup: Setup) -> bool:
    """The FlashInfer sampler of a release that runs it by default (0.22+): its size is read off vLLM 0.10.1
    (FlashInfer 0.2.11) rows only; 0.27.1 (r114) printed 0.31 GiB peak activation, under the 0.54 planned."""
    version = ctx.version
    return setup.sampler_path == FLASHINFER_SAMPLER and (not version or version >= FLASHINFER_SAMPLER_DEFAULT_FROM)


def activation_component(ctx: Context, setup: Setup, last_stage: bool) -> Component:
    model, constants = ctx.model, ctx.constants
    tokens = setup.profile_tokens
    forward = forward_peak_bytes(model, tokens, ctx.tp, ctx.dtype, constants)
    key = SAMPLER_KEYS[setup.sampler_path]
    sampled = min(setup.max_num_seqs, tokens)
    sampler = sampler_peak_bytes(model, sampled, constants, key) if last_stage else 0.0
    moe = moe_workspace_bytes(model, tokens, ctx.tp, ctx.dtype, constants)
    names = [key, "forward_intermediate_copies", "forward_hidden_copies"] + (["moe_workspace_copies"] if moe else [])
    rel = constants.band(*names) + (0.25 if model.vision_params else 0.0) \
        + (UNKNOWN_TERM_BAND if setup.unknown_terms or later_flashinfer(ctx, setup) else 0.0)
    persists = setup.mode == "v1" and (not ctx.version or ctx.version >= MOE_WORKSPACE_PERSISTS_FROM)

    def peak(sampler_bytes: float) -> float:
        return max(forward, sampler_bytes) + moe if persists else max(forward + moe, sampler_bytes)

    value = peak(sampler)
    rel_low = rel
    if last_stage and not setup.sampler_path_known:
        # Which path runs depends on the install: the low end is the sort-free FlashInfer sampler's peak.
        other = peak(sampler_peak_bytes(model, sampled, constants, SAMPLER_KEYS[FLASHINFER_SAMPLER]))
        rel_low = max(rel, 1 - other * (1 - rel) / value) if value else rel
    note = (f"dummy forward at max_num_batched_tokens={tokens}"
            + (" (V0 chunked prefill caps the profiled tokens)" if setup.mode == "v0" and setup.chunked_prefill else "")
            + (f" and {setup.sampler_path} sampler on {sampled} sequences x {model.vocab_size} vocab (fp32)"
               if last_stage else "")
            + ((" + fused-MoE workspace (persistent from 0.13)" if persists else " (fused-MoE caches freed before "
                "the sampler runs)") if moe else "")
            + ("; multimodal encoder profiling not modelled" if model.vision_params else ""))
    return band("activation_peak", value, rel_low, rel, constants.provenance(*names), note)


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


def non_torch_component(ctx: Context, setup: Setup) -> Component:
    key = non_torch_key(ctx, setup)
    if setup.mode == "v0" and setup.multi_gpu:
        what = " (NCCL init and custom all-reduce buffers, inside V0's profiling window; " + \
               ("NVSwitch node)" if "nvswitch" in key else "PCIe / no NVSwitch)")
    else:
        what = " (custom all-reduce / NCCL buffers)" if ctx.tp > 1 else " (cuBLAS/Triton workspaces)"
    return ctx.constant_component("non_torch", key, "memory outside PyTorch that grows during profiling" + what,
                                  extra_band=UNKNOWN_TERM_BAND if setup.unknown_terms else 0.0)


def graphs_component(ctx: Context, setup: Setup, stage: int) -> Component:
    constants = ctx.constants
    layers_local = len(ctx.layer_range(stage))
    graphs = cuda_graph_bytes(ctx.model, layers_local, vllm_capture_sizes(setup.max_num_seqs), constants)
    if setup.graphs_in_budget:
        graphs *= constants["cuda_graph_estimate_ratio"]
    names = ("cuda_graph_base_bytes", "cuda_graph_per_layer_bytes")
    rel = constants.band(*names) + (UNKNOWN_TERM_BAND if setup.unknown_terms else 0.0)
    where = ("; estimated during profiling and taken from the budget (V1 >= 0.20)" if setup.graphs_in_budget else
             "; captured after the KV cache is allocated, so it must fit in the 1 - util headroom")
    return band("cuda_graphs", graphs, rel, rel, constants.provenance(*names),
                "CUDA graph pool for decode batch sizes" + where, in_budget=setup.graphs_in_budget)


def stage_components(ctx: Context, setup: Setup, stage: int) -> list[Component]:
    """Everything but the KV cache on one pipeline stage's GPU."""
    components = [ctx.constant_component(
        "cuda_context", "cuda_context_bytes",
        "CUDA context and library handles, before vLLM's baseline snapshot" if setup.context_outside_budget else
        "CUDA context and library handles: V1 before 0.9.1 counts every non-torch byte on the card in its budget",
        in_budget=not setup.context_outside_budget)]
    if setup.multi_gpu and setup.mode == "v1":
        components.append(ctx.nccl_component(
            "NCCL communicators created at start-up"
            + ("; outside the budget since V1 inits them before the snapshot" if setup.nccl_outside_budget
               else "; inside the profiling window"), in_budget=not setup.nccl_outside_budget))
    components.append(weights_with_absorption(ctx, stage) if setup.mode == "v0" and v0_mla_absorbs(ctx)
                      else ctx.weights_component(stage))
    components.append(activation_component(ctx, setup, last_stage=stage == ctx.pp - 1))
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
    stages = []
    for stage in range(ctx.pp):
        shapes = ctx.kv_shapes(stage)
        kinds = ctx.model.kinds
        state_layers = sum(1 for i in ctx.layer_range(stage) if kinds[i] in ("mamba", "linear"))
        state = ctx.state_bytes_per_seq(stage, recurrent_state_dtype(ctx))
        state_per_layer = state // max(1, state_layers) if state_layers else 0
        if state_layers and shapes and not ctx.settings.block_size:
            attn_per_token = max(shape.bytes_per_token_layer for shape in shapes)
            block_size = 16 * math.ceil(state_per_layer / (16 * attn_per_token))
        stages.append((shapes, state_layers, state_per_layer))
    layouts = [pool.layout(shapes, block_size, n, per_layer, hybrid_manager=hybrid_manager)
               for shapes, n, per_layer in stages]
    per_token = [sum(shape.layers * shape.bytes_per_token_layer for shape in shapes) for shapes, _, _ in stages]
    return PoolPlan(layouts, per_token, block_size, ctx.state_bytes_per_seq(0, recurrent_state_dtype(ctx)))


def limits_rule(ctx: Context, setup: Setup, pools: PoolPlan, stage_offsets: list[int], blocks_per_request: int):
    """KV bytes -> blocks (the minimum over stages), tokens and concurrency as this era reports them."""
    first = pools.layouts[0]
    hybrid = first.num_groups > 1
    length, block_size, version = setup.max_model_len, pools.block_size, ctx.version

    def limits(kv_bytes: int) -> Limits:
        blocks = min(pool.num_blocks(max(0, kv_bytes + offset), layout)
                     for offset, layout in zip(stage_offsets, pools.layouts, strict=True))
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
    return [f"Free memory on device ({free_at_start / GIB:.2f}/{ctx.total / GIB:.2f} GiB) on startup is less than "
            f"desired GPU memory utilization ({setup.utilization}, {budget / GIB:.2f} GiB)"]


def plan_notes(ctx: Context, setup: Setup, first_layout: pool.PoolLayout) -> list[str]:
    notes = ctx.longer_than_trained(
        setup.max_model_len, "vLLM",
        ctx.settings.allow_long_max_model_len or bool(ctx.settings.rope_scaling_factor),
        "vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (--allow-long-max-model-len) or a "
        "rope-scaling override (--rope-scaling-factor) extends the context")
    if first_layout.padded_layers:
        waste = first_layout.padded_layers / max(1, first_layout.num_groups * first_layout.group_size)
        notes.append(f"hybrid KV groups: {first_layout.padded_layers} padding layer slots "
                     f"(up to {waste:.1%} of the pool unused), as vLLM logs 'Add N padding layers'")
    if not setup.graphs_in_budget and not ctx.settings.enforce_eager:
        notes.append("CUDA graphs are captured after the KV cache exists: they need the 1 - util headroom")
    if setup.mode == "v0" and setup.chunked_prefill and not ctx.settings.max_num_batched_tokens:
        notes.append(f"V0 enables chunked prefill above a 32k context: the profile runs {setup.profile_tokens} "
                     f"tokens, not {setup.max_model_len}")
    if ctx.gpu.arch in PRE_AMPERE:
        backend = "XFormers" if setup.mode == "v0" else "a Triton/FlexAttention backend"
        notes.append(f"{ctx.gpu.arch.title()} has no FlashAttention 2: vLLM {setup.mode.upper()} uses {backend}"
                     + ("; float16 instead of the config's bfloat16" if ctx.model.torch_dtype == "bfloat16" else ""))
    if not setup.sampler_path_known:
        notes.append(f"vLLM {ctx.settings.resolved_version} profiles the sampler with FlashInfer when it is installed "
                     "(the docker image) and by sorting the vocabulary otherwise (pip without the flashinfer extra): "
                     "planned as the sort, band widened to FlashInfer's; pass --flashinfer-sampler on|off")
    if later_flashinfer(ctx, setup):
        notes.append(f"unknown term, band widened (activation peak): the FlashInfer sampler vLLM "
                     f"{ctx.settings.resolved_version} runs by default is measured only on 0.10.1 (FlashInfer 0.2)")
    notes += [f"unknown term, band widened: {why}" for why in setup.unknown_terms]
    return notes


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("vLLM")
    setup = resolve_setup(ctx)
    settings = ctx.settings
    stages = [stage_components(ctx, setup, stage) for stage in range(ctx.pp)]
    components = stages[0]
    fixed_kv = settings.kv_cache_memory_bytes
    budget = int(fixed_kv if fixed_kv else setup.utilization * ctx.total)

    def kv_rule(parts: list[Component], point: str) -> int:
        return int(fixed_kv) if fixed_kv else budget - pick(parts, point)

    pools = pool_plan(ctx, hybrid_manager=setup.mode == "v1")
    first = pools.layouts[0]
    # A later stage's KV = stage 0's KV + the difference of their in-budget components.
    offsets = [pick(components, "mid") - pick(stage, "mid") for stage in stages]
    blocks_per_request = pool.blocks_per_request(first, setup.max_model_len, setup.profile_tokens,
                                                 ctx.model.sliding_window, ctx.model.attention_chunk_size)
    resolved = {
        "engine_mode": setup.mode, "gpu_memory_utilization": setup.utilization, "max_num_seqs": setup.max_num_seqs,
        "max_num_batched_tokens": setup.profile_tokens, "max_model_len": setup.max_model_len,
        "block_size": pools.block_size, "tensor_parallel_size": ctx.tp, "pipeline_parallel_size": ctx.pp,
        "dtype": ctx.dtype, "kv_cache_dtype": settings.kv_cache_dtype,
        "quantization": ctx.quant.method if ctx.quant else None, "enforce_eager": settings.enforce_eager,
        "kv_cache_memory_bytes": fixed_kv, "chunked_prefill": setup.chunked_prefill,
        "sampler": setup.sampler_path if setup.sampler_path_known else f"{setup.sampler_path} (or flashinfer if installed)",
    }
    return PolicyResult(
        components=components, budget_bytes=budget, kv_rule=kv_rule,
        limits=limits_rule(ctx, setup, pools, offsets, blocks_per_request), max_model_len=setup.max_model_len,
        block_size=pools.block_size, kv_bytes_per_token=pools.bytes_per_token[0], settings=resolved,
        kv_provenance=ENGINE if not fixed_kv else DEFAULT,
        kv_note=("--kv-cache-memory: fixed by the user" if fixed_kv else
                 f"util x total ({setup.utilization} x {ctx.total / GIB:.2f} GiB) less the in-budget components"),
        per_sequence_state_bytes=pools.state_bytes_per_seq,
        reasons=start_up_refusals(ctx, setup, components, budget), notes=plan_notes(ctx, setup, first),
        min_blocks_needed=blocks_per_request,
        extra={"blocks_per_request": blocks_per_request, "hybrid_groups": [list(g) for g in first.groups]},
    )
