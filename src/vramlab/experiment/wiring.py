"""From a plan to the things a window needs: the input set, the load shape for a value of the
changed variable, and the samplers the plan asks for."""

from __future__ import annotations

from pathlib import Path

from vramlab.experiment.plan import Plan
from vramlab.load.driver import LoadShape, Window
from vramlab.load.prompts import Prompt, PromptMaker, jsonl_prompts, synthetic_prompts
from vramlab.load.retry import RetryPolicy
from vramlab.observe.base import Sampler


async def prompts_for(
    plan: Plan, value: float, base_dir: Path, maker: PromptMaker | None = None
) -> list[Prompt]:
    """The same input set for every window; only prompt_tokens, when it is the variable, changes it.
    Synthetic prompts are sized in the target's tokenizer where *maker* has a counter for it."""
    inp = plan.fixed.input
    if inp.synthetic is not None:
        s = inp.synthetic
        pt = int(value) if plan.change.variable == "prompt_tokens" else s.prompt_tokens
        if maker is not None:
            return await maker.synthetic(pt, s.output_tokens, s.count, s.seed)
        return synthetic_prompts(pt, s.output_tokens, s.count, s.seed)
    path = Path(inp.jsonl)  # type: ignore[arg-type]
    return jsonl_prompts(path if path.is_absolute() else base_dir / path)


def shape_for(plan: Plan, value: float, seed: int) -> LoadShape:
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
    )


def window_for(plan: Plan, max_s: float) -> Window:
    ph = plan.phases
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
