"""The experiment's load client for a run: in this process, or a pool of worker processes
(load/workers.py), with `ignore_eos` probed first."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vramlab.experiment.plan import Plan
from vramlab.experiment.wiring import max_connections
from vramlab.load.client import OpenAIClient

if TYPE_CHECKING:
    from vramlab.experiment.kind import RunOptions


async def engine_accepts_ignore_eos(plan: Plan, api_key: str | None, note: Callable[[str], None]) -> bool:
    """`ignore_eos` is not in OpenAI's API: vLLM, SGLang and llama.cpp accept it, others answer 4xx
    (e.g. `HTTP 422: Unexpected fields in the request: {'ignore_eos'}`). One request of one token
    with it: a 4xx naming the field drops it for the run, with a note quoting the server."""
    from vramlab.load.prompts import Prompt

    async with OpenAIClient(
        plan.target.url,
        plan.target.model,
        plan.target.api,
        api_key,
        max_connections=1,
        timeout_s=plan.load.request_timeout_s,
        ignore_eos=True,
    ) as probe:
        res = await probe.send("ignore-eos-probe", Prompt("Say OK.", None, 1), 1, time.perf_counter())
    if 400 <= res.status_code < 500 and "ignore_eos" in (res.error or ""):
        note(
            f"ignore_eos dropped: the server refused the field ({res.error}); outputs may end before "
            "output_tokens"
        )
        return False
    return True


async def open_load(
    plan: Plan, o: RunOptions, stack: contextlib.AsyncExitStack, note: Callable[[str], None]
) -> tuple[OpenAIClient | None, Any, int]:
    """(client, pool, workers): one client in this process, or a pool of worker processes; *stack* closes it."""
    from vramlab.load.workers import ClientConfig, WorkerPool, workers_needed

    conns = max_connections(plan, plan.change.values())
    rate = plan.load.request_rate
    if plan.change.variable == "request_rate":
        rate = max([rate or 0.0, *plan.change.values()])
    n = (
        o.workers
        if o.workers is not None
        else workers_needed(conns, rate if plan.load.mode == "open" else None)
    )
    if n < 1:
        raise ValueError("workers must be at least 1")
    cfg = ClientConfig(
        plan.target.url,
        plan.target.model,
        plan.target.api,
        o.api_key,
        max_connections=conns,
        timeout_s=plan.load.request_timeout_s,
        ignore_eos=plan.fixed.ignore_eos and await engine_accepts_ignore_eos(plan, o.api_key, note),
        http_client=plan.load.http_client,
    )
    if n == 1:
        client = await stack.enter_async_context(
            OpenAIClient(
                cfg.base_url,
                cfg.model,
                cfg.api,
                cfg.api_key,
                max_connections=cfg.max_connections,
                timeout_s=cfg.timeout_s,
                ignore_eos=cfg.ignore_eos,
                http_client=cfg.http_client,
            )
        )
        note(
            f"load: HTTP client {client.http_client}"
            f"{' (kernel receive stamps)' if client.http_client == 'fast' else ''}"
        )
        return client, None, 1
    pool = await stack.enter_async_context(WorkerPool(n, cfg))
    note(
        f"load: {n} worker processes (pids {', '.join(map(str, pool.pids))}), one schedule; "
        f"{'--workers' if o.workers is not None else 'one per core: the plan needs more than one'}"
    )
    return None, pool, n


__all__ = ["engine_accepts_ignore_eos", "open_load"]
