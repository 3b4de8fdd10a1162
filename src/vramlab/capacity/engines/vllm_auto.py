"""vLLM's `--max-model-len auto` (or -1): the longest context one request can hold in the KV pool.

vllm/v1/core/kv_cache_utils.py `_auto_fit_max_model_len` (PR #29431, merged late November 2025; the
first release is not pinned: 0.12.0 is taken; read in the 0.29.0 wheel): the engine profiles and
sizes the pool with the context the config derives, then, when `original_max_model_len == -1`, binary
searches per worker the largest length whose one-request memory (`_max_memory_usage_bytes_from_groups`:
group size x page x the blocks every group needs, sliding groups only their window) fits the memory
available for KV, takes the smallest over the workers and logs "Auto-fit max_model_len: reduced from X
to Y to fit in available GPU memory (Z GiB available for KV cache)" (or "full model context length X
fits"). Nothing fits a single token: "Cannot auto-fit max_model_len: not enough GPU memory available
to serve even a single token". The profile, the components and the pool are the derived length's; only
the admission and the concurrency use the fitted one.
"""

from __future__ import annotations

from dataclasses import replace

from vramlab.capacity import pool
from vramlab.capacity.engines import vllm
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.search import largest
from vramlab.errors import ConfigError
from vramlab.units import gib

AUTO_FROM = (0, 12, 0)


def plan(ctx: Context) -> PolicyResult:
    s = ctx.settings
    if not s.max_model_len_auto:
        return vllm.plan(ctx)
    if ctx.version and ctx.version < AUTO_FROM:
        raise ConfigError(
            f"--max-model-len auto: vLLM {s.resolved_version} has no auto-fit (-1 / auto from "
            f"{'.'.join(map(str, AUTO_FROM))}, PR #29431); give a length"
        )
    derived = vllm.plan(Context(ctx.model, ctx.gpu, s.with_(max_model_len=None), ctx.constants))
    kv = derived.kv_rule(derived.components, "mid")
    longest = fitted_length(ctx, derived, kv)
    if longest <= 0:
        raise ConfigError(
            "vLLM: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single "
            f"token ({gib(kv, unit=True)} for KV). Try increasing `gpu_memory_utilization`."
        )
    if longest >= derived.max_model_len:
        note = f"Auto-fit max_model_len: full model context length {derived.max_model_len} fits in available GPU memory"
        return replace(derived, notes=[note, *derived.notes])
    fitted = vllm.plan(Context(ctx.model, ctx.gpu, s.with_(max_model_len=longest), ctx.constants))
    note = (
        f"Auto-fit max_model_len: reduced from {derived.max_model_len} to {longest} to fit in available GPU "
        f"memory ({gib(kv)} GiB available for KV cache)"
    )
    # the pool is the derived length's profile; the fitted length sets what one request needs
    settings = dict(derived.settings, max_model_len=longest)
    return replace(
        derived,
        limits=fitted.limits,
        max_model_len=longest,
        min_blocks_needed=fitted.min_blocks_needed,
        settings=settings,
        notes=[note, *derived.notes],
        extra=dict(derived.extra, blocks_per_request=fitted.min_blocks_needed),
    )


def fitted_length(ctx: Context, derived: PolicyResult, kv_bytes: int) -> int:
    """The largest length in [1, derived] whose one request fits *kv_bytes* (0 when one token does not)."""
    layout = vllm.pool_plan(ctx, hybrid_manager=True).layouts[0]
    given = derived.settings.get("max_num_batched_tokens")
    tokens = given if isinstance(given, int) else 0

    def fits(length: int) -> bool:
        need = pool.blocks_per_request(
            layout, length, tokens, ctx.model.sliding_window, ctx.model.attention_chunk_size
        )
        return need * layout.bytes_per_block <= kv_bytes

    return largest(1, derived.max_model_len, fits) or 0
