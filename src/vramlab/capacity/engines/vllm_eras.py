"""What vLLM resolves before it profiles anything, release by release (docs/research/capacity-anchors.md §1).

The era tables (the release each rule starts or ends in, with the source line it comes from) and the
decisions read off them: V0 or V1, the batch defaults of each release and card, V0's chunked prefill,
the profiled sampler's path, vLLM's own refusals for a card, and the eras and cards whose terms no log
has measured (their bands widen). vllm.py turns the resolved ``Setup`` into components and limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlab.capacity.defaults import v0_chunked_prefill
from vramlab.capacity.defaults import vllm_batch as defaults
from vramlab.capacity.defaults import vllm_context as context_length
from vramlab.capacity.engines.common import Context
from vramlab.errors import ConfigError
from vramlab.units import GIB

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
# config/cache.py gpu_memory_utilization defaults to 0.92 (0.19: 0.9; capacity/defaults.py decides it).
GRAPH_ESTIMATE_FROM = (0, 20)
TOKENS_AS_CONCURRENCY_FROM = (0, 27)
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
FLASHINFER_OPT_IN_FROM = (
    0,
    11,
    1,
)  # <= 0.11.0: `VLLM_USE_FLASHINFER_SAMPLER is not False` = on when importable;
# the wheel requires flashinfer-python only from 0.11.1 (before: the `flashinfer` extra, or the docker image)
TRITON_TOP_K_TOP_P_FROM = (0, 17)
FLASHINFER_SAMPLER_DEFAULT_FROM = (
    0,
    22,
)  # envs.VLLM_USE_FLASHINFER_SAMPLER: bool = True (0.20: None = opt-in)
SORT_SAMPLER, FLASHINFER_SAMPLER, TRITON_SAMPLER = "sort", "flashinfer", "triton"
# gpu_model_runner.py `_dummy_sampler_run`, 0.22.0 on (absent in 0.20.0): after the FlashInfer run the profile calls the
# sampler again with a per-request generator "to warm forward_native", which FlashInfer cannot take: `forward_cuda` falls
# back to `forward_native` -> `apply_top_k_top_p`, the Triton kernel for >= 8 sequences (the sort below 8). The profiled
# peak is the larger of the two runs (not in the 'processed_logits' / 'processed_logprobs' logprobs modes).
WARM_NATIVE_SAMPLER_FROM = (0, 22)
# FlashInfer's run from the source (vllm.py flashinfer_bytes): the sampler's fp32 copy, top_k_mask_logits' output and
# the softmax, each 4 B per (sequence x vocab entry), beside the logits; FlashInfer 0.6's top_k_mask_logits also takes a
# 1 MiB row-state buffer (`_get_cache_buf`, flashinfer/sampling.py 0.6.11.post2 and 0.6.18). Band: down to the 8 B the
# 0.10.1 rows printed (0.55 of 14 B), up 10 % for the buffer, the per-row vectors and the allocator's rounding.
FLASHINFER_FP32_TENSORS = 3
FLASHINFER_ROW_STATES_BYTES = 1 << 20
FLASHINFER_SOURCE_BAND = (0.55, 1.10)
# The native warm-up run after it (0.22+): its 15.6 B come from 0.19, where the Triton run was the only one; the 0.22+
# rows print less: r114 (0.27.1, Qwen2.5-0.5B, 256 sequences) a 0.31 GiB peak activation, 8.6 B per (sequence x vocab
# entry), and r256 (0.24.0) a pool 0.28 GiB larger than that run allows. The low end reaches them; the high end stays
# the measured run's.
WARM_NATIVE_LOW_SEEN = 8.6 / 15.6
TRITON_MIN_BATCH = 8  # topk_topp_sampler.py: `if HAS_TRITON and logits.shape[0] >= 8`
# The fused-MoE caches: per-call temporaries (fused_moe.py `cache13 = torch.empty(...)`), freed before the sampler
# runs, until 0.13.0 moved them into the persistent `current_workspace_manager()` (fused_moe/modular_kernel.py).
MOE_WORKSPACE_PERSISTS_FROM = (0, 13)
UNKNOWN_TERM_BAND = 0.5  # added to the band of a term whose value for this era/card is not measured
# vllm/utils/mem_utils.py `memory_profiling`, 0.27.0 on: non_kv_cache_memory = total_consumed (the init snapshot's free
# memory less the free memory after the profile, cudaMemGetInfo) + transient_peak_headroom (torch peak less what is
# still allocated); 0.19-0.26: weights_memory + torch_peak_increase + non_torch_increase. The new sum also charges the
# budget with torch memory held outside the weights from before the profile and the allocator's cached segments that
# empty_cache cannot release; their size follows the install and the allocator, not the model's shapes.
TOTAL_CONSUMED_FROM = (0, 27)
# 0.27+ logs that print the split ("X GiB for consumed memory (weights + non-torch)" beside "Model loading took W GiB"):
# one card, 0.26-0.30 GiB beyond the weights (0.31.0 A100 Llama-3.1-8B r113, 0.27.1 RTX 4090 Qwen2.5-0.5B r114), what
# non_torch_forward_bytes plans; TP 4 over PCIe without custom all-reduce (0.27.1, 4x RTX PRO 6000, r110) 1.70 GiB, the
# fused-MoE workspace included, against 0.15 GiB of NCCL growth read off 0.10 rows: the high end reaches it there.
CONSUMED_BEYOND_WEIGHTS_SEEN = 1.70 * GIB
# V1 PP over PCIe: the tightest stage of 0.27.1 PP 4 (r112) and 0.28.0 PP 2 (r216) kept 0.9 GiB more non-KV memory than
# planned, 0.3-0.6 GiB more than TP on the same cards (r110, r215); which term (NCCL send/recv, the PP intermediate
# buffers) is not pinned. A band, never a planned value.
PP_PCIE_UNEXPLAINED_SEEN = 0.9 * GIB


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
        raise ConfigError(
            f"vLLM {ctx.settings.resolved_version} has no V0 engine (removed in 0.11; "
            "leave out --engine-version to plan the last release that had it)"
        )
    if asked in ("v0", "v1"):
        return asked
    return "v1" if not version or version >= V1_DEFAULT_FROM else "v0"


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


SAMPLER_KEYS = {
    SORT_SAMPLER: "legacy_sampler_bytes_per_seq_vocab",
    FLASHINFER_SAMPLER: "flashinfer_sampler_bytes_per_seq_vocab",
    TRITON_SAMPLER: "sampler_bytes_per_seq_vocab",
}


def nvls(ctx: Context) -> bool:
    """NCCL NVLink-SHARP buffers exist on NVSwitch systems of Hopper and Blackwell cards."""
    gpu = ctx.gpu
    if ctx.settings.gpu_p2p is False or gpu.nvswitch is False:
        return False
    if gpu.nvswitch:
        return gpu.arch in ("hopper", "blackwell")
    return gpu.arch in ("hopper", "blackwell") and "pcie" not in gpu.name and gpu.nominal_gb >= 80


def unknown_terms(ctx: Context, kind: str) -> tuple[str, ...]:
    """Eras and cards whose overhead terms no log of theirs has measured: their bands widen."""
    out = []
    version, gpu = ctx.version, ctx.gpu
    if version and version < MODELLED_FROM:
        out.append(
            f"vLLM {ctx.settings.resolved_version} predates the profiling of 0.5+ (no log of that era here)"
        )
    if version and version > MODELLED_UP_TO:
        out.append(f"vLLM {ctx.settings.resolved_version} is newer than the newest release modelled (0.29)")
    if gpu.vendor == "amd":
        out.append("ROCm: HIP graphs, quick all-reduce and the ROCm attention backends are not measured")
    if gpu.arch in PRE_AMPERE and kind == "v1":
        out.append(f"V1 on {gpu.arch.title()}: its attention backend's profile peak is not measured")
    if ctx.settings.in_trainer:
        # Unsloth notebooks (vLLM inside GRPO trainers): KV off by -41 % to +100 % around a 0.3 % median elsewhere.
        out.append(
            "vLLM inside a training process: the trainer's own allocations in the same process "
            "(optimizer state, LoRA buffers, shared weights) are not modelled"
        )
    multi_gpu = ctx.tp * ctx.pp > 1
    if kind == "v1" and multi_gpu and ctx.on_nvswitch and version and version < NCCL_BEFORE_SNAPSHOT_FROM:
        # Before 0.11 NCCL init and its NVLink/NVLS buffers fall inside V1's profiling window; their size is
        # measured on 0.19 H100 nodes (outside the window), not on a release of this era.
        out.append(
            f"V1 {ctx.settings.resolved_version} at TP/PP > 1 on an NVSwitch node: NCCL init counts against "
            "the budget before 0.11, and its size (with the NVLink-SHARP buffers) is measured only on 0.19"
        )
    if kind == "v1" and ctx.tp > 1 and not nvls(ctx) and version and version >= NCCL_BEFORE_SNAPSHOT_FROM:
        # non_torch_forward_tp_nonvls_bytes is read off 0.10 rows; 0.27.1 on 4 PCIe RTX PRO 6000 (r110) printed
        # 1.70 GiB of "consumed memory (weights + non-torch)" beyond its weights.
        out.append(
            f"V1 {ctx.settings.resolved_version} at TP > 1 without NVLink-SHARP: the non-torch growth is measured "
            "on 0.10 only (0.15 GiB there; up to 1.7 GiB seen on 0.27 PCIe nodes)"
        )
    if (
        kind == "v1"
        and ctx.pp > 1
        and not ctx.on_nvswitch
        and version
        and version >= NCCL_BEFORE_SNAPSHOT_FROM
    ):
        # non_torch_forward_pp_bytes is read off 0.19 H100 (NVLink) PP rows.
        out.append(
            f"V1 {ctx.settings.resolved_version} at PP > 1 without NVLink: the stages' non-torch growth is measured "
            "on 0.19 NVLink nodes only (0.07 GiB); 0.27-0.28 PP on PCIe cards left up to 0.9 GiB more non-KV "
            "memory on the tightest stage than planned"
        )
    if kind == "v0" and ctx.model.is_mla:
        # DeepSeek-R1 on 8x H200, V0 ~0.7.3: weights 83.88 GiB (headers 79.4), non-torch 7.16 GiB.
        out.append(
            "V0 with MLA: the non-torch term at this size is not modelled"
            if v0_mla_absorbs(ctx)
            else "V0 with MLA: the absorbed MLA matrices of this release and the non-torch term are not modelled"
        )
    return tuple(out)


def v0_mla_absorbs(ctx: Context) -> bool:
    low, high = V0_MLA_ABSORPTION
    return ctx.model.is_mla and ctx.version is not None and low <= ctx.version < high


def resolve_setup(ctx: Context) -> Setup:
    kind = engine_kind(ctx)
    check_card(ctx, kind)
    util, seqs, tokens = defaults(ctx, kind)
    path, path_known = sampler_path(ctx, kind)
    if not 0 < util <= 1:
        raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    version = ctx.version
    return Setup(
        mode=kind,
        utilization=util,
        max_num_seqs=seqs,
        profile_tokens=tokens,
        max_model_len=context_length(ctx),
        chunked_prefill=kind == "v1" or v0_chunked_prefill(ctx),
        nccl_outside_budget=kind == "v1" and (not version or version >= NCCL_BEFORE_SNAPSHOT_FROM),
        context_outside_budget=kind == "v0" or not version or version >= V1_SNAPSHOT_FROM,
        sampler_path=path,
        sampler_path_known=path_known,
        graphs_in_budget=kind == "v1"
        and (not version or version >= GRAPH_ESTIMATE_FROM)
        and not ctx.settings.enforce_eager,
        multi_gpu=ctx.tp * ctx.pp > 1,
        unknown_terms=unknown_terms(ctx, kind),
    )


def check_card(ctx: Context, kind: str) -> None:
    """vLLM's own refusals for a card: compute capability below 7.0, bf16 before Ampere."""
    gpu = ctx.gpu
    if gpu.arch == "pascal":
        raise ConfigError(
            f"vLLM needs compute capability 7.0 or newer; {gpu.name} (Pascal) is 6.x "
            "(use llama.cpp, or a community Pascal build of vLLM)"
        )
    if gpu.arch in PRE_AMPERE and ctx.settings.dtype in ("bfloat16", "bf16"):
        raise ConfigError(
            f"Bfloat16 is only supported on GPUs with compute capability of at least 8.0; "
            f"{gpu.name} ({gpu.arch.title()}) is older: use --dtype half"
        )
