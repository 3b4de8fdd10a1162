"""vLLM's profiled activation peak: the dummy forward, the sampler's runs (sort, Triton, FlashInfer from the source,
the 0.22+ native warm-up), the fused-MoE workspace and, on the first stage, the vision encoder's profile (vllm_mm.py).
The policy that sums it with the other components is vllm.py."""

from __future__ import annotations

from dataclasses import dataclass

from vramlab.capacity.engines.common import Context
from vramlab.capacity.engines.vllm_eras import (
    FLASHINFER_FP32_TENSORS,
    FLASHINFER_ROW_STATES_BYTES,
    FLASHINFER_SAMPLER,
    FLASHINFER_SAMPLER_DEFAULT_FROM,
    FLASHINFER_SOURCE_BAND,
    MOE_WORKSPACE_PERSISTS_FROM,
    SAMPLER_KEYS,
    SORT_SAMPLER,
    TRITON_MIN_BATCH,
    TRITON_SAMPLER,
    UNKNOWN_TERM_BAND,
    WARM_NATIVE_LOW_SEEN,
    WARM_NATIVE_SAMPLER_FROM,
    Setup,
)
from vramlab.capacity.engines.vllm_mm import BLOCK_BAND, EncoderProfile, encoder_profile, limits_of
from vramlab.capacity.estimate import Component, band
from vramlab.capacity.overheads import (
    forward_peak_bytes,
    moe_workspace_bytes,
    sampler_peak_bytes,
)
from vramlab.capacity.spec import dtype_bytes
from vramlab.units import gib


@dataclass(frozen=True)
class SamplerTerm:
    """The profiled sampler's peak (the larger of its runs) with its own band, and the constants behind it."""

    bytes: float
    low_bytes: float
    high_bytes: float
    keys: tuple[str, ...]
    warm_native: bool


def flashinfer_from_source(ctx: Context, setup: Setup) -> bool:
    """The FlashInfer run of a release that runs it by default (0.22+), sized from the source (flashinfer_bytes)."""
    version = ctx.version
    return setup.sampler_path == FLASHINFER_SAMPLER and (
        not version or version >= FLASHINFER_SAMPLER_DEFAULT_FROM
    )


def flashinfer_bytes(ctx: Context, sampled: int) -> tuple[float, float, float]:
    """(expected, low, high) of the FlashInfer run, from the source. vLLM 0.22.0-0.29.0 `_dummy_sampler_run` keeps the
    logits (activation dtype) while `Sampler.forward` makes its fp32 copy (`logits.to(torch.float32)`) and
    `flashinfer_sample` calls `top_k_top_p_sampling_from_logits` with a per-row top-k tensor: FlashInfer 0.6.11.post2
    and 0.6.18 (the releases' requirements/cuda.txt pins) take the masked path, `top_k_mask_logits` (a new fp32
    tensor) then `torch.softmax` (another), as FlashInfer 0.2.11 under vLLM 0.10.1 did; the 0.6 fast path wants an
    integer top-k. So dtype + 3 x 4 B per (sequence x vocab entry), plus FlashInfer's 1 MiB row-state buffer. The
    low end keeps the 8 B the 0.10.1 rows printed (allocator reuse), the high end the buffer and rounding."""
    per_entry = dtype_bytes(ctx.dtype) + FLASHINFER_FP32_TENSORS * 4
    value = sampled * ctx.model.vocab_size * per_entry + FLASHINFER_ROW_STATES_BYTES
    return value, value * FLASHINFER_SOURCE_BAND[0], value * FLASHINFER_SOURCE_BAND[1]


def sampler_term(ctx: Context, setup: Setup, sampled: int) -> SamplerTerm:
    """The profiled sampler: its kernel's run and, 0.22+ with FlashInfer, the native warm-up run after it (each
    run's temporaries are freed before the next: the peak is the larger, each end the larger of the ends)."""
    constants, model = ctx.constants, ctx.model

    def run(key: str) -> tuple[float, float, float]:
        value, rel = sampler_peak_bytes(model, sampled, constants, key), constants.band(key)
        return value, value * (1 - rel), value * (1 + rel)

    key = SAMPLER_KEYS[setup.sampler_path]
    from_source = flashinfer_from_source(ctx, setup)
    runs = [flashinfer_bytes(ctx, sampled) if from_source else run(key)]
    keys: tuple[str, ...] = () if from_source else (key,)
    warm_native = (
        setup.mode == "v1"
        and setup.sampler_path == FLASHINFER_SAMPLER
        and (not ctx.version or ctx.version >= WARM_NATIVE_SAMPLER_FROM)
    )
    if warm_native:
        native = SAMPLER_KEYS[TRITON_SAMPLER if sampled >= TRITON_MIN_BATCH else SORT_SAMPLER]
        value, low, high = run(native)
        runs.append((value, min(low, value * WARM_NATIVE_LOW_SEEN), high))
        keys += (native,)
    expected, low, high = (max(r[i] for r in runs) for i in range(3))
    return SamplerTerm(expected, low, high, keys, warm_native)


def stage0_encoder(ctx: Context, setup: Setup) -> EncoderProfile | None:
    """What V1 profiles the vision tower with (vllm_mm.py), on the first pipeline stage, which runs it."""
    if setup.mode != "v1":
        return None
    return encoder_profile(
        ctx.model,
        max_model_len=setup.max_model_len,
        max_num_batched_tokens=setup.profile_tokens,
        max_num_seqs=setup.max_num_seqs,
        chunked_prefill=setup.chunked_prefill,
        limits=limits_of(ctx.settings.limit_mm_per_prompt),
        version=ctx.version,
        model_dtype=ctx.dtype,
        tp=ctx.tp,
    )


def activation_component(
    ctx: Context, setup: Setup, last_stage: bool, first_stage: bool = True, enc: EncoderProfile | None = None
) -> Component:
    """The profiled peak on one stage; *enc* is the first stage's vision-encoder profile (stage0_encoder)."""
    model, constants = ctx.model, ctx.constants
    tokens = setup.profile_tokens
    forward = forward_peak_bytes(model, tokens, ctx.tp, ctx.dtype, constants)
    sampled = min(setup.max_num_seqs, tokens)
    sampler = sampler_term(ctx, setup, sampled) if last_stage else None
    moe = moe_workspace_bytes(model, tokens, ctx.tp, ctx.dtype, constants)
    names = [*(sampler.keys if sampler else ()), "forward_intermediate_copies", "forward_hidden_copies"] + (
        ["moe_workspace_copies"] if moe else []
    )
    # V1 runs the vision tower first and keeps its pixels and embeddings through the dummy forward (vllm_mm.py).
    modelled_tower = (
        model.vision is not None and setup.mode == "v1"
    )  # profiled as vllm_mm.py says, or not at all
    rel = (
        constants.band(*names)
        + (0.25 if model.vision_params and not modelled_tower else 0.0)
        + (UNKNOWN_TERM_BAND if setup.unknown_terms else 0.0)
    )
    persists = setup.mode == "v1" and (not ctx.version or ctx.version >= MOE_WORKSPACE_PERSISTS_FROM)

    def peak(sampler_bytes: float) -> float:
        return max(forward, sampler_bytes) + moe if persists else max(forward + moe, sampler_bytes)

    held = enc.held_bytes if enc else 0.0
    decoder = peak(sampler.bytes if sampler else 0.0) + held
    value = max(decoder, enc.encoder_peak_bytes if enc else 0.0)
    rel_low = rel
    if sampler and decoder == value and sampler.bytes > forward:  # never narrower than the sampler's own runs
        rel = max(rel, sampler.high_bytes / sampler.bytes - 1)
        rel_low = max(rel_low, 1 - (peak(sampler.low_bytes) + held) / value)
    if enc and value > decoder:
        # The tower's peak sets it; the forward's own uncertainty only matters up to where it would overtake.
        rel, rel_low = max(BLOCK_BAND, decoder * (1 + rel) / value - 1), BLOCK_BAND
    if last_stage and not setup.sampler_path_known:
        # Which path runs depends on the install: the low end is the sort-free FlashInfer sampler's peak.
        other = max(
            peak(sampler_peak_bytes(model, sampled, constants, SAMPLER_KEYS[FLASHINFER_SAMPLER])) + held,
            enc.encoder_peak_bytes if enc else 0.0,
        )
        rel_low = max(rel_low, 1 - other * (1 - rel_low) / value) if value else rel_low
    note = _activation_note(
        ctx, setup, tokens, sampled, sampler, moe, persists, enc, modelled_tower, first_stage
    )
    return band("activation_peak", value, rel_low, rel, constants.provenance(*names), note)


def _activation_note(
    ctx: Context,
    setup: Setup,
    tokens: int,
    sampled: int,
    sampler: SamplerTerm | None,
    moe: float,
    persists: bool,
    enc: EncoderProfile | None,
    modelled_tower: bool,
    first_stage: bool,
) -> str:
    model = ctx.model
    return (
        f"dummy forward at max_num_batched_tokens={tokens}"
        + (
            " (V0 chunked prefill caps the profiled tokens)"
            if setup.mode == "v0" and setup.chunked_prefill
            else ""
        )
        + (
            f" and {setup.sampler_path} sampler on {sampled} sequences x {model.vocab_size} vocab (fp32)"
            + (
                " sized from the source (logits + 3 fp32 copies)"
                if flashinfer_from_source(ctx, setup)
                else ""
            )
            if sampler
            else ""
        )
        + (
            " then the native top-k/top-p warm-up run (the larger of the two peaks, 0.22+)"
            if sampler and sampler.warm_native
            else ""
        )
        + (
            (
                " + fused-MoE workspace (persistent from 0.13)"
                if persists
                else " (fused-MoE caches freed before the sampler runs)"
            )
            if moe
            else ""
        )
        + (
            f"; before it the {enc.describe()}: {gib(enc.encoder_peak_bytes, unit=True)} at the tower's peak, "
            f"{gib(enc.held_bytes, unit=True)} of its pixels and embeddings held through the forward"
            if enc
            else "; every modality limited to 0 (--limit-mm-per-prompt): no encoder profile"
            if modelled_tower and first_stage
            else "; the vision encoder is profiled on the first pipeline stage"
            if modelled_tower
            else "; multimodal encoder profiling not modelled"
            if model.vision_params
            else ""
        )
    )
