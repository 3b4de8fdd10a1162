"""From a plan to the things a window needs: the input set, the load shape for a value of the
changed variable, and the samplers the plan asks for."""

from __future__ import annotations

import weakref
from pathlib import Path

from vramlab.experiment.plan import Plan
from vramlab.experiment.plan_conversations import Conversations
from vramlab.load.driver import LoadShape, Window
from vramlab.load.prompts import Prompt, PromptMaker, jsonl_prompts, synthetic_prompts
from vramlab.load.retry import RetryPolicy
from vramlab.load.trace import TraceRequest
from vramlab.observe.base import Sampler


async def prompts_for(
    plan: Plan, value: float, base_dir: Path, maker: PromptMaker | None = None
) -> list[Prompt]:
    """The same input set for every window; only prompt_tokens, when it is the variable, changes it.
    Synthetic prompts are sized in the target's tokenizer where *maker* has a counter for it."""
    inp = plan.fixed.input
    if inp.trace is not None:
        return (await trace_input(plan, base_dir, maker))[1]
    if inp.synthetic is not None:
        s = inp.synthetic
        pt = int(value) if plan.change.variable == "prompt_tokens" else s.prompt_tokens
        if maker is not None:
            return await maker.synthetic(pt, s.output_tokens, s.count, s.seed)
        return synthetic_prompts(pt, s.output_tokens, s.count, s.seed)
    if inp.conversations is not None:
        return await _conversations(inp.conversations, maker)
    path = Path(inp.jsonl)  # type: ignore[arg-type]
    return jsonl_prompts(path if path.is_absolute() else base_dir / path)


async def _conversations(cv: Conversations, maker: PromptMaker | None) -> list[Prompt]:
    """The conversations' prompts: every question and the system prompt sized in the target's
    tokenizer where *maker* can count (else one token a word)."""
    from vramlab.load.conversations import ConversationShape, conversation_prompts

    n = cv.count * cv.turns

    async def texts(tokens: int, count: int, seed: int) -> list[Prompt]:
        if maker is not None:
            return await maker.synthetic(tokens, cv.output_tokens, count, seed)
        return synthetic_prompts(tokens, cv.output_tokens, count, seed)

    system = (await texts(cv.system_prompt_tokens, 1, cv.seed + 1))[0].text if cv.system_prompt_tokens else ""
    shape = ConversationShape(
        cv.count,
        cv.turns,
        cv.output_tokens,
        cv.tool_every,
        cv.tool_pause_s,
        tuple((t.name, t.share) for t in cv.tenants),
    )
    return conversation_prompts(system, await texts(cv.user_tokens, n, cv.seed), shape)


# One trace's requests and prompts per run: learning its words' costs asks the target's tokenizer
# (load/blocks.py), which a new value of the variable must not repeat: kept with the run's PromptMaker.
_TRACES: weakref.WeakKeyDictionary[object, tuple[list[TraceRequest], list[Prompt], str]] = (
    weakref.WeakKeyDictionary()
)


async def trace_input(
    plan: Plan, base_dir: Path, maker: PromptMaker | None = None
) -> tuple[list[TraceRequest], list[Prompt], str]:
    """(the trace's requests, one prompt each, the note that says how they were sized)."""
    from vramlab.load.trace import read_trace, trace_prompts

    inp = plan.fixed.input
    if maker is None or maker not in _TRACES:  # without a tokenizer nothing is asked: read it again
        path = Path(inp.trace)  # type: ignore[arg-type]
        trace = read_trace(
            path if path.is_absolute() else base_dir / path,
            inp.format,  # type: ignore[arg-type]
            inp.time_scale,
            inp.max_requests,
        )
        prompts, note = await trace_prompts(trace, maker, inp.seed)
        if maker is None:
            return trace, prompts, note
        _TRACES[maker] = (trace, prompts, note)
    return _TRACES[maker]


def trace_schedule(trace: list[TraceRequest], plan: Plan, value: float) -> tuple[float, ...]:
    """The send times of a trace's window: its own, or stretched to a request_rate step's mean rate."""
    from vramlab.load.trace import mean_rate, offsets

    times = offsets(trace)
    rate = mean_rate(trace)
    if plan.change.variable == "request_rate" and rate:
        return tuple(t * rate / value for t in times)
    return times


def shape_for(plan: Plan, value: float, seed: int, schedule: tuple[float, ...] | None = None) -> LoadShape:
    """The window's load at *value*; *schedule*: a trace's send times (open loop)."""
    ld, var = plan.load, plan.change.variable
    conc = ld.concurrency if ld.mode == "closed" else ld.max_concurrency
    rate = ld.request_rate
    max_tokens = None
    if var == "concurrency":
        conc = int(value)
    elif var == "request_rate":
        rate = value
    elif var == "output_tokens":
        max_tokens = int(value)
    return LoadShape(
        mode=ld.mode,
        concurrency=conc,
        request_rate=rate,
        arrival=ld.arrival,
        burstiness=ld.burstiness,
        seed=seed,
        max_tokens=max_tokens,
        schedule=schedule,
    )


def window_for(plan: Plan, max_s: float, phase: str = "") -> Window:
    ph, soak = plan.phases, plan.change.soak
    if phase == "treatment" and soak is not None:  # the soak: one window of its own length
        return Window(duration_s=soak.duration_s, requests=None, max_s=max(0.0, max_s), drain_s=ph.drain_s)
    return Window(duration_s=ph.duration_s, requests=ph.requests, max_s=max(0.0, max_s), drain_s=ph.drain_s)


def retry_for(plan: Plan) -> RetryPolicy:
    r = plan.load.retry
    return RetryPolicy(
        policy=r.policy, max_attempts=r.max_attempts, base_s=r.base_s, max_s=r.max_s, jitter=r.jitter
    )


def max_connections(plan: Plan, values: list[float]) -> int:
    """The connection pool: the largest number of requests that can be in flight at once."""
    ld = plan.load
    cap = ld.concurrency if ld.mode == "closed" else ld.max_concurrency
    if plan.change.variable == "concurrency":
        cap = max([cap, *(int(v) for v in values)])
    return max(1, cap)


def samplers_for(plan: Plan) -> list[Sampler]:
    from vramlab.observe.health import HealthSampler
    from vramlab.observe.host import HostSampler
    from vramlab.observe.ledger import LedgerSampler
    from vramlab.observe.nvml import GpuSampler
    from vramlab.observe.ollama import OllamaSampler
    from vramlab.observe.prom_api import PromApiSampler
    from vramlab.observe.prom_text import PromTextSampler

    sp, tg = plan.samplers, plan.target
    out: list[Sampler] = []
    for src in sp.sources:
        if src == "gpu":
            out.append(GpuSampler())
        elif src == "ledger":
            out.append(LedgerSampler(sp.ledger))  # type: ignore[arg-type]
        elif src == "engine":
            out.append(PromTextSampler(tg.metrics_endpoint(_root(tg.url))))
        elif src == "prometheus":
            out.append(PromApiSampler(sp.prometheus_url, sp.prometheus_queries))  # type: ignore[arg-type]
        elif src == "host":
            out.append(HostSampler(tg.pid))
        elif src == "health":
            # no health URL in the plan: the sampler finds the path the target answers on (drill's rule)
            out.append(
                HealthSampler(tg.health_url)
                if tg.health_url
                else HealthSampler(_root(tg.url) + "/health", discover_root=_root(tg.url))
            )
        elif src == "ollama":
            out.append(OllamaSampler(_root(tg.url)))
    if (
        tg.kind == "ollama" and "ollama" not in sp.sources
    ):  # its loads and unloads belong on every Ollama run's timeline
        out.append(OllamaSampler(_root(tg.url)))
    return out


def _root(base_url: str) -> str:
    b = base_url.rstrip("/")
    return b[:-3] if b.endswith("/v1") else b
