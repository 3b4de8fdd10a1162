"""The capacity model's account of where the drill should break, written before the ramp starts,
so the report can set "predicted limit" beside "observed failure".

The reasoning mirrors the engines (docs/research/capacity-anchors.md): the KV pool is allocated at
start-up, so a longer context or more users first fill the pool (preemption, queueing), not the
card; what can still run out at run time is the activation workspace, which grows with the tokens
of one forward pass up to `max_num_batched_tokens` (where the engine's profile measured its peak).
Pure: the estimate and the free memory come in as numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlab.records.event_payloads import CapacityData
from vramlab.units import GIB, gib


@dataclass(frozen=True)
class Account:
    predicted_limit: float | None  # in the ramp's unit; None: the model predicts no OOM on this knob
    message: str
    figures: CapacityData  # the capacity event's data, less predicted_limit


def predict(
    knob: str,
    *,
    activation_peak_bytes: int,
    max_num_batched_tokens: int,
    free_bytes: int,
    users: int,
    prompt_tokens: int,
    kv_cache_tokens: int,
    max_model_len: int | None,
    tokens_per_request: int,
) -> Account:
    """Where the knob should first cause an allocation failure (or why it should not)."""
    figures: CapacityData = {
        "activation_peak_bytes": activation_peak_bytes,
        "max_num_batched_tokens": max_num_batched_tokens,
        "free_bytes": free_bytes,
        "kv_cache_tokens": kv_cache_tokens,
    }
    per_token = activation_peak_bytes / max(1, max_num_batched_tokens)
    if knob == "context":
        # one pass holds up to min(users x context, max_num_batched_tokens) tokens
        fit_tokens = int(free_bytes / per_token) if per_token else 0
        if fit_tokens >= max_num_batched_tokens:
            return Account(
                None,
                f"the activation peak ({gib(activation_peak_bytes, unit=True)} at "
                f"{max_num_batched_tokens} batched tokens) fits in the {gib(free_bytes, unit=True)} free: "
                "longer contexts should queue or be refused, not run out of memory",
                figures,
            )
        limit = fit_tokens / max(1, users)
        return Account(
            limit,
            f"{gib(free_bytes, unit=True)} free holds the activations of ~{fit_tokens} batched tokens "
            f"({per_token / 1024:.1f} KiB per token); with {users} users the prompt should fail above "
            f"~{limit:.0f} tokens",
            {**figures, "fit_tokens": fit_tokens},
        )
    if knob == "balloon":
        need = min(activation_peak_bytes, int(per_token * users * prompt_tokens))
        limit = max(0.0, (free_bytes - need) / GIB)
        return Account(
            limit,
            f"the engine needs ~{gib(need, unit=True)} of activation room under this load; a balloon "
            f"above ~{limit:.2f} GiB of the {gib(free_bytes, unit=True)} free should break it",
            figures,
        )
    if knob in ("concurrency", "batch"):
        seqs = kv_cache_tokens / max(1, tokens_per_request)
        return Account(
            None,
            f"the KV pool holds {kv_cache_tokens} tokens (~{seqs:.0f} requests of {tokens_per_request} "
            "tokens); beyond that the engine preempts or queues rather than running out of memory",
            {**figures, "kv_concurrency": seqs},
        )
    return Account(None, "no capacity prediction for this knob", figures)


def for_sim(plan: Any, free_bytes: int) -> Account | None:
    """The account for a sim target (its model, card and settings are known); None elsewhere."""
    sim = plan.target.sim
    if plan.target.kind != "sim" or sim is None:
        return None
    from vramlab.capacity import estimate
    from vramlab.run.capacity_plan import resolve_facts, target_facts

    # the same engine and settings as the plan the drill stores (its sim's fields and extra_args)
    facts = target_facts(plan.target.model, plan.target.engine, sim, plan.capacity, None)
    spec, card, settings = resolve_facts(facts)
    est = estimate(spec, card, settings)
    chunk = est.settings.get("max_num_batched_tokens") or est.settings.get("chunked_prefill_size")
    eff_mnbt = int(chunk if chunk and chunk > 0 else est.max_model_len or 8192)
    return predict(
        plan.ramp.knob,
        activation_peak_bytes=est.activation_peak_bytes,
        max_num_batched_tokens=eff_mnbt,
        free_bytes=free_bytes,
        users=plan.load.concurrency,
        prompt_tokens=plan.load.prompt_tokens,
        kv_cache_tokens=est.kv_cache_tokens,
        max_model_len=est.max_model_len,
        tokens_per_request=plan.load.prompt_tokens + plan.load.max_tokens,
    )


__all__ = ["Account", "for_sim", "predict"]
