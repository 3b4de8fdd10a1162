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

Observed, from what the engine shows, per step: the pool full (KV usage at 98 % or more, or requests
waiting for most of the window while the usage left less free than one of the step's requests takes:
vLLM admits a waiting request only once its blocks can be allocated, vllm/v1/core/sched/scheduler.py
`schedule` at 0.32.0, so a pool with less room than a request is full to the next one), its preemption
counter rising, requests waiting for most of the window, and requests refused for their length (the
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
UNPAGED = ("llama.cpp", "transformers")  # a request waits for a slot or its turn here, never for pool room


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
    kv_full: Hit | None  # KV usage >= 98 %, or requests waiting with less room than one request
    preemption: Hit | None  # the engine's preemption counter rose
    queueing: Hit | None  # requests waiting for most of the window
    refusal: Hit | None  # requests refused for their length (a context beyond what the engine holds)
    step_values: tuple[float, ...] = ()  # the ramp's values, in order (what "one step apart" counts in)

    @property
    def predicted_step_value(self) -> float | None:
        """The first step at or past the predicted value: where the plan says the engine shows its limit
        (a pool full at that load, or past it a preemption, a queue, a refusal). None when the predicted
        value is beyond the last step or there is none."""
        if self.predicted_value is None:
            return None
        return next((v for v in self.step_values if v >= self.predicted_value), None)

    @property
    def steps_apart(self) -> int | None:
        """How many steps lie between the predicted step and the observed one (0: the same step); None
        when either is missing. A limit predicted beyond the ramp and never seen agrees (0)."""
        seen, pred = self.observed, self.predicted_step_value
        if seen is None and pred is None and self.predicted_value is not None and self.step_values:
            return 0
        if seen is None or pred is None or seen.value not in self.step_values:
            return None
        return abs(self.step_values.index(seen.value) - self.step_values.index(pred))

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
        per_req = request_tokens(plan, prompt, output)
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


def request_tokens(plan: CapacityEstimate | None, prompt: float, output: int) -> int:
    """The pool tokens one request holds at its end: prompt and output in whole pool blocks."""
    paged = plan is not None and (plan.engine or "") not in UNPAGED
    block = ((plan.block_size if plan else None) or 1) if paged else 1
    return int(-(-(int(prompt) + output) // block) * block)


def _pool_full(
    s: StepSignals, variable: str, plan: CapacityEstimate | None, pool_tokens: int | None, shape: RequestShape
) -> str | None:
    """Why the step's pool counts as full (its detail), or None: usage at 98 % or more, or requests queued
    while the free share was less than one of the step's requests (the engine admits none then)."""
    usage = s.kv_usage_max
    if usage is None:
        return None
    if usage >= SATURATED:
        return ""
    prompt = s.value if variable in ("prompt_tokens", "context") else shape.prompt_tokens
    paged = str((plan.engine if plan else None) or "") not in UNPAGED  # cells up front, or no pool at all
    if not (paged and s.queued and pool_tokens and prompt):
        return None
    need = request_tokens(plan, prompt, shape.output_tokens or 0)
    if (1 - usage) * pool_tokens < need:
        return (
            f"requests waited with {usage:.0%} of the pool in use: less room than one "
            f"{need:,}-token request holds"
        )
    return None


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
        full = _pool_full(s, variable, plan, pool_tokens, shape)
        seen = {"kv_full": full is not None, "preemption": s.preempted, "queueing": s.queued}
        for k, hit in seen.items():
            if hit and first[k] is None:
                first[k] = Hit(s.value, s.round, s.step, (full or "") if k == "kv_full" else "")
    return Saturation(
        variable,
        pred,
        basis,
        binding,
        first["kv_full"],
        first["preemption"],
        first["queueing"],
        refusals(requests),
        tuple(sorted({s.value for s in steps} | _request_steps(requests))),
    )


def _request_steps(requests: Sequence[RequestRecord]) -> set[float]:
    """The step values the requests were sent at (a step with no engine sample still counts)."""
    return {r.step_value for r in requests if r.phase in STEP_PHASES and r.step_value is not None}


__all__ = [
    "CONTEXT_REFUSAL",
    "Hit",
    "RequestShape",
    "Saturation",
    "StepSignals",
    "request_shape",
    "request_tokens",
    "saturation",
]
