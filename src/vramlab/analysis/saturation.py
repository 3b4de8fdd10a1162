"""The KV saturation point, from both sides: where the plan says the changed variable fills what the
engine holds for requests, and where the engine showed it.

Predicted, per engine (the plan's `engine` and settings):
- a paged pool (vLLM, SGLang, TGI, the sim): concurrency fills it at pool tokens / the tokens of one
  request (the step's own requests: their median stored prompt plus output tokens, in whole pool
  blocks), unless `max_num_seqs` binds first (then requests queue with the pool not full); the
  context fills it at pool tokens / concurrent requests less the output, and past the model's
  length less the output a prompt is refused;
- llama.cpp: every slot's cells are allocated up front, so the pool never fills at run time: more
  requests than `--parallel` slots wait for one (llama-server's slots), and a prompt beyond a slot's
  context less the output is refused ("exceed context window");
- transformers serve without continuous batching answers one request at a time: a second waits.
  It has no pool: a longer context needs more memory until the card runs out (no prediction).

Observed, from what the engine shows, per step: KV usage at 98 % or more, its preemption counter
rising, requests waiting for most of the window, and requests refused for their length (the
engines' words: vLLM "maximum context length", llama-server "exceeds the available context size",
llama-cpp-python "exceed context window", TGI "must be <=", SGLang "longer than the model's context
length"). Each hit names its step, value and round. Pure: reads records and the plan's JSON.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vramlab.records import RequestRecord
from vramlab.records.capacity_plan import CapacityEstimate, as_int

SATURATED = 0.98  # the pool is full to within a block or two per sequence (vLLM tops out near 99 %)
CONTEXT_REFUSAL = re.compile(
    r"maximum context length|exceeds? the available context|exceed context window|"
    r"longer than the model's context length|tokens \+ `max_new_tokens` must be <=|context length exceeded",
    re.IGNORECASE,
)
QUEUE_LIMITS = ("slots", "max_num_seqs", "serial")  # binding limits that queue requests, not fill a pool
STEP_PHASES = ("treatment", "ramp")


@dataclass(frozen=True)
class Hit:
    """Where a signal first showed: the step's value, its round and step number."""

    value: float
    round: int
    step: int | None
    detail: str = ""


@dataclass(frozen=True)
class StepSignals:
    """What the engine showed in one step's window (composition rows carry the sampled ones)."""

    round: int
    step: int | None
    value: float
    kv_usage_max: float | None
    preempted: bool
    queued: bool


@dataclass(frozen=True)
class Saturation:
    variable: str
    predicted_value: float | None  # the variable's value at which the binding limit is reached
    predicted_basis: str
    binding: str  # "pool", "slots", "max_num_seqs", "serial", "context" or "" (none predicted)
    kv_full: Hit | None  # KV usage >= 98 %
    preemption: Hit | None  # the engine's preemption counter rose
    queueing: Hit | None  # requests waiting for most of the window
    refusal: Hit | None  # requests refused for their length (a context beyond what the engine holds)

    @property
    def observed(self) -> Hit | None:
        """The first step where the engine showed the limit: the pool full, a preemption, a refusal
        for length; queueing too where the predicted limit is one that queues (slots, max_num_seqs,
        serial serving) rather than the pool (queueing alone can be the batch limit)."""
        hits = [self.kv_full, self.preemption, self.refusal]
        if self.binding in QUEUE_LIMITS:
            hits.append(self.queueing)
        found = [h for h in hits if h is not None]
        return min(found, key=lambda h: (h.value, h.round)) if found else None

    @property
    def observed_value(self) -> float | None:
        hit = self.observed
        return None if hit is None else hit.value


@dataclass(frozen=True)
class RequestShape:
    prompt_tokens: int | None
    output_tokens: int | None
    users: int
    measured: bool  # from the step's stored requests (else the plan document's figures)


def request_shape(plan_doc: dict[str, Any], requests: Sequence[RequestRecord]) -> RequestShape:
    """The tokens of one request: the steps' own stored requests (median prompt and output tokens of
    the successful ones), else the plan document's; and the concurrent users the plan runs."""
    syn = ((plan_doc.get("fixed") or {}).get("input") or {}).get("synthetic") or {}
    load = plan_doc.get("load") or {}
    users = int(load.get("concurrency", 1) or 1)
    ok = [r for r in requests if r.phase in STEP_PHASES and r.ok and r.prompt_tokens]
    if ok:
        out = [r.output_tokens for r in ok if r.output_tokens is not None]
        return RequestShape(
            int(statistics.median(r.prompt_tokens or 0 for r in ok)),
            int(statistics.median(out)) if out else None,
            users,
            True,
        )
    if syn:
        return RequestShape(int(syn["prompt_tokens"]), int(syn["output_tokens"]), users, False)
    if "prompt_tokens" in load:  # a drill's load
        return RequestShape(int(load["prompt_tokens"]), int(load.get("max_tokens", 0)), users, False)
    return RequestShape(None, None, users, False)


def predict(
    variable: str, plan: CapacityEstimate | None, pool_tokens: int | None, shape: RequestShape
) -> tuple[float | None, str, str]:
    """(value, basis, binding) where *variable* reaches the engine's limit; None when none applies."""
    engine = (plan.engine or "") if plan else ""
    settings = plan.settings if plan else {}
    prompt, output = shape.prompt_tokens, shape.output_tokens or 0
    sized = "the steps' own requests" if shape.measured else "the plan's requests"
    if variable in ("concurrency", "batch"):
        if engine == "transformers" and not settings.get("continuous_batching"):
            return 1.0, "transformers serve answers one request at a time: a second waits", "serial"
        if engine == "llama.cpp":
            slots = as_int(settings.get("parallel")) or 1
            return float(slots), f"{slots} slot(s) (--parallel): a request beyond them waits for one", "slots"
        if not pool_tokens or prompt is None:
            return None, "no KV pool known", ""
        block = ((plan.block_size if plan else None) or 1) if engine != "llama.cpp" else 1
        per_req = -(-(prompt + output) // block) * block
        pred = float(pool_tokens // per_req)
        basis = f"{int(pool_tokens):,} pool tokens / {per_req:,} tokens a request ({sized})"
        seqs = as_int(settings.get("max_num_seqs"))
        if seqs and seqs < pred:
            return (
                float(seqs),
                basis + f"; max_num_seqs {seqs} binds first: beyond it requests queue",
                "max_num_seqs",
            )
        return pred, basis, "pool"
    if variable in ("prompt_tokens", "context"):
        longest = plan.max_model_len if plan else None
        if engine == "transformers":
            return None, "no KV pool: a longer context needs more memory until the card runs out", ""
        if engine == "llama.cpp" and longest:
            return (
                float(int(longest) - output),
                f"a slot's context of {int(longest):,} tokens less {output} output tokens: a longer prompt is refused",
                "context",
            )
        if not pool_tokens:
            return None, "no KV pool known", ""
        users = max(1, shape.users)
        pred = float(pool_tokens // users - output)
        basis = (
            f"{int(pool_tokens):,} pool tokens / {users} concurrent request(s), less {output} output tokens"
        )
        if longest and int(longest) - output < pred:
            return (
                float(int(longest) - output),
                basis
                + f"; the model's length {int(longest):,} less the output binds first: longer is refused",
                "context",
            )
        return pred, basis, "pool"
    return None, f"{variable} does not fill the KV pool by itself", ""


def refusals(requests: Sequence[RequestRecord]) -> Hit | None:
    """The first step (lowest value) where a request was refused for its length, in the engine's words."""
    by_step: dict[tuple[float, int, int | None], list[RequestRecord]] = {}
    for r in requests:
        if r.phase in STEP_PHASES and r.step_value is not None:
            by_step.setdefault((r.step_value, r.round, r.step), []).append(r)
    for (value, rnd, step), rs in sorted(by_step.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        refused = [r for r in rs if not r.ok and r.error and CONTEXT_REFUSAL.search(r.error)]
        if refused:
            said = " ".join((refused[0].error or "").split())[:160]
            return Hit(value, rnd, step, f"{len(refused)} of {len(rs)} requests refused: {said}")
    return None


def saturation(
    variable: str,
    plan: CapacityEstimate | None,
    pool_tokens: int | None,
    shape: RequestShape,
    steps: Sequence[StepSignals],
    requests: Sequence[RequestRecord],
) -> Saturation:
    pred, basis, binding = predict(variable, plan, pool_tokens, shape)
    first: dict[str, Hit | None] = {"kv_full": None, "preemption": None, "queueing": None}
    for s in sorted(steps, key=lambda s: (s.value, s.round)):
        seen = {
            "kv_full": s.kv_usage_max is not None and s.kv_usage_max >= SATURATED,
            "preemption": s.preempted,
            "queueing": s.queued,
        }
        for k, hit in seen.items():
            if hit and first[k] is None:
                first[k] = Hit(s.value, s.round, s.step)
    return Saturation(
        variable,
        pred,
        basis,
        binding,
        first["kv_full"],
        first["preemption"],
        first["queueing"],
        refusals(requests),
    )


__all__ = [
    "CONTEXT_REFUSAL",
    "Hit",
    "RequestShape",
    "Saturation",
    "StepSignals",
    "request_shape",
    "saturation",
]
