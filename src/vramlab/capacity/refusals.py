"""What the engine refuses at start-up for the pool, the memory the process holds, and what the target
(a unified machine, a MIG slice, a capped or MPS-limited share) adds to the plan (`capacity/devices.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vramlab.capacity import devices
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import Component
from vramlab.units import gib


@dataclass(frozen=True)
class DeviceTerms:
    notes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def memory_allowance(ctx: Context) -> int:
    """What the process may hold: the device less what others hold, and under an MPS limit at most the limit."""
    free = ctx.total - ctx.other
    limit = ctx.settings.mps_memory_limit_bytes
    return min(free, limit) if limit else free


def device_terms(ctx: Context, r: PolicyResult, comps: tuple[Component, ...], used: int) -> DeviceTerms:
    """The target's notes and refusals, and its facts for the JSON (`device`)."""
    gpu, settings = ctx.gpu, ctx.settings
    notes = devices.device_notes(gpu, settings, comps, r.budget_bytes, ctx.other)
    mps_notes, mps_refusals = devices.mps_limit(gpu, settings, used)
    if gpu.kind == "discrete" and not settings.mps_memory_limit_bytes:
        return DeviceTerms()
    facts: dict[str, Any] = {
        "kind": gpu.kind,
        "parent": gpu.parent or None,
        "held_before_start_bytes": ctx.other,
    }
    if gpu.kind == "unified":
        facts["system_memory_bytes"] = int(gpu.system_memory_gib * (1 << 30))
        facts["profile_peak_bytes"] = sum(c.bytes for c in comps if c.name in devices.PROFILE_TERMS)
    if settings.mps_memory_limit_bytes:
        facts["mps_memory_limit_bytes"] = settings.mps_memory_limit_bytes
    return DeviceTerms(notes + mps_notes, mps_refusals, {"device": facts})


def refusals(
    ctx: Context, r: PolicyResult, kv_bytes: int, blocks: int, used: int, headroom: int
) -> list[str]:
    """The engine's own start-up refusals for the pool, and a card too small for the process. The
    quoted wording is vLLM's; other engines get a plain statement (they word it their own way)."""
    vllm = ctx.settings.engine == "vllm"
    reasons = []
    if kv_bytes <= 0 and not r.kv_fixed:
        reasons.append(
            "No available memory for the cache blocks: the non-KV components exceed the budget"
            if vllm
            else "no memory is left for the KV cache: the non-KV components exceed the engine's budget"
        )
    elif blocks < r.min_blocks_needed and not r.kv_fixed:
        need = r.min_blocks_needed * (kv_bytes / max(1, blocks)) if blocks else 0
        if not need:
            reasons.append(f"the KV cache cannot hold one request of {r.max_model_len} tokens")
        elif vllm:
            reasons.append(
                f"To serve at least one request with the model's max seq len ({r.max_model_len}), "
                f"{gib(need, unit=True)} KV cache is needed, which is larger than the available KV cache memory "
                f"({gib(kv_bytes, unit=True)})"
            )
        else:
            reasons.append(
                f"one request of {r.max_model_len} tokens needs {gib(need, unit=True)} of KV cache; "
                f"the pool holds {gib(kv_bytes, unit=True)}"
            )
    if headroom < 0 and not ctx.settings.mps_memory_limit_bytes:  # an MPS limit has its own refusal (devices)
        reasons.append(
            f"the process needs {gib(used, unit=True)} but the {'host' if ctx.gpu.is_host else 'card'} has "
            f"{gib(ctx.total - ctx.other, unit=True)} free ({gib(-headroom, unit=True)} short)"
        )
    return reasons


def used_bytes(comps: list[Component], kv: Component, r: PolicyResult) -> int:
    """Memory the process holds at steady state: the budget's contents plus what sits outside it."""
    inside = sum(c.bytes for c in comps if c.in_budget) + kv.bytes
    outside = sum(c.bytes for c in comps if not c.in_budget)
    return max(inside, 0) + outside
