"""A start-up the engine refused for want of KV cache, beside the plan for the same settings.

A refused start-up prints the capacity it found in the refusal itself: vLLM V0 the pool in tokens ("The
model's max seq len (N) is larger than the maximum number of tokens that can be stored in KV cache (M)"),
V1 the KV memory it had and, from 0.9, the longest context that memory holds ("... the estimated maximum
model length is M"); SGLang that the pool came out empty ("Not enough memory. Please try to increase
--mem-fraction-static."); TGI 3.x that the pool is below one request ("Not enough memory to handle
`max_total_tokens=N`"). Each becomes sentences comparing it with the plan's own pool and verdict.
"""

from __future__ import annotations

from typing import Any

from vramlab.capacity.estimate import Estimate
from vramlab.logs.observation import Observation


def _pct(planned: float, seen: float) -> str:
    return f" ({(planned - seen) / abs(seen):+.1%})" if seen else ""


def _verdict(est: Estimate) -> str:
    return "the plan refuses it too" if not est.fits else "the plan would start it (it plans no refusal)"


def refusal_lines(obs: Observation, est: Estimate, longest: Any = None) -> list[str]:
    """Sentences for a refused start-up (empty when the log shows none). *longest* is a callable giving the
    plan's longest max_model_len one request fits, asked only when the log prints vLLM's estimate of it."""
    extra = obs.extra
    refused_len = extra.get("refused_max_model_len")
    out: list[str] = []
    if refused_len and extra.get("kv_capacity_tokens") is not None:
        seen = int(extra["kv_capacity_tokens"])
        out.append(
            f"refused: max_model_len {refused_len:,} is above the {seen:,} tokens the engine's KV cache holds; "
            f"the plan holds {est.kv_cache_tokens:,}{_pct(est.kv_cache_tokens, seen)}; {_verdict(est)}"
        )
    elif refused_len and obs.kv_cache_bytes is not None:
        gib = 1 << 30
        line = (
            f"refused: max_model_len {refused_len:,} needs more KV cache than the engine's "
            f"{obs.kv_cache_bytes / gib:.2f} GiB; the plan has {est.kv_available_bytes / gib:.2f} GiB"
        )
        estimated = extra.get("estimated_max_model_len")
        if estimated and longest is not None:
            planned = int(longest())
            line += (
                f"; the longest context the engine estimates one request fits is {estimated:,}, the plan's "
                f"{planned:,}{_pct(planned, estimated)}"
            )
        out.append(f"{line}; {_verdict(est)}")
    elif extra.get("kv_pool_empty"):
        out.append(
            f"refused: SGLang found no room for a KV pool (the pool came out at zero tokens or fewer); the plan "
            f"holds {est.kv_cache_tokens:,} tokens; {_verdict(est)}"
        )
    elif extra.get("kv_capacity_below_tokens"):
        below = int(extra["kv_capacity_below_tokens"])
        out.append(
            f"refused: TGI's pool holds fewer than max_total_tokens {below:,}; the plan holds "
            f"{est.kv_cache_tokens:,} tokens; {_verdict(est)}"
        )
    return out
