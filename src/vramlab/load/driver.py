"""Drive one observation window of load: an open loop (arrivals with a concurrency cap) or a
closed loop (N users), bounded by a request count and by time, always.

Open loop is "sleep, then gate": each request has a scheduled send time from the arrival process;
when the cap is full it waits for a slot and is sent late (never skipped; the schedule does not shift), and its
latency still counts from the scheduled time (AIPerf's request-rate-with-max-concurrency). The
wait is the request's dispatch lag. Cancelling the window (a stop condition, Ctrl-C) reports every
in-flight request as ``cancelled`` before the cancellation propagates: nothing sent goes unrecorded.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from vramlab.load.arrivals import Arrival, gaps
from vramlab.load.client import RequestResult
from vramlab.load.prompts import Prompt
from vramlab.load.retry import RetryPolicy
from vramlab.records.stats import percentile


class Sender(Protocol):
    async def send(self, request_id: str, prompt: Prompt, max_tokens: int, scheduled_at: float,
                   attempt: int = 0) -> RequestResult: ...


@dataclass(frozen=True)
class LoadShape:
    mode: Literal["closed", "open"] = "closed"
    concurrency: int = 1  # closed: users; open: the in-flight cap
    request_rate: float | None = None
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    max_tokens: int | None = None  # overrides each prompt's own output length


@dataclass(frozen=True)
class Window:
    duration_s: float | None = None
    requests: int | None = None
    max_s: float = 3600.0  # the hard time bound when the window is counted in requests
    drain_s: float = 5.0


@dataclass(frozen=True)
class WindowOutcome:
    sent: int
    elapsed_s: float
    lag_p99_ms: float
    lag_max_ms: float


def _settle_gc() -> None:
    """Collect once, then freeze what survives, before a window starts.

    A full (gen-2) collection walks every tracked object, the imported libraries included: on the
    2-core benchmark machine that was a 15-40 ms stall in the middle of a window, and every request
    scheduled during it was sent late (the benchmark's P99 from the schedule). Frozen objects are
    never walked again, so the collections inside the window see only the window's own objects.
    What is frozen is alive already (the collect first keeps garbage out of it), and it is unfrozen
    when the window ends, so nothing is kept for good.
    """
    gc.collect()
    gc.freeze()


async def drive(
    sender: Sender,
    prompts: Iterator[Prompt],
    shape: LoadShape,
    window: Window,
    on_result: Callable[[RequestResult], None],
    retry: RetryPolicy = RetryPolicy(),
    id_prefix: str = "r",
) -> WindowOutcome:
    _settle_gc()
    pc = time.perf_counter
    start = pc()
    span = window.duration_s if window.duration_s is not None else window.max_s
    deadline = start + min(span, window.max_s)
    limit = window.requests if window.requests is not None else 2**62
    lags: list[float] = []
    rng = random.Random(shape.seed)
    inflight: set[asyncio.Task[None]] = set()
    sent = 0

    async def one(rid: str, prompt: Prompt, scheduled: float) -> None:
        max_tokens = shape.max_tokens or prompt.output_tokens
        attempt = 0
        while True:
            t_sent = pc()
            try:
                res = await sender.send(rid, prompt, max_tokens, scheduled, attempt)
            except asyncio.CancelledError:
                now = pc()
                on_result(RequestResult(request_id=rid, attempt=attempt, scheduled_at=scheduled, sent_at=t_sent,
                                        end_at=now, error_class="cancelled", error="the window was cancelled",
                                        prompt_tokens=prompt.prompt_tokens))
                raise
            on_result(res)
            if not retry.should_retry(attempt, res.status_code, res.error_class):
                return
            delay = retry.delay_s(attempt, rng)
            if delay:
                await asyncio.sleep(delay)
            attempt += 1

    def spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        return task

    try:
        if shape.mode == "open":
            if not shape.request_rate:
                raise ValueError("an open loop needs a request rate")
            sem = asyncio.Semaphore(shape.concurrency)
            g = gaps(shape.request_rate, shape.arrival, shape.burstiness, shape.seed)
            next_t = start

            async def gated(rid: str, prompt: Prompt, scheduled: float) -> None:
                try:
                    await one(rid, prompt, scheduled)
                finally:
                    sem.release()

            while sent < limit and next_t < deadline:
                delay = next_t - pc()
                if delay > 0:
                    await asyncio.sleep(delay)
                if sem.locked():
                    # The cap is full: wait for a slot, but not past the window's end.
                    try:
                        await asyncio.wait_for(sem.acquire(), timeout=max(0.0, deadline - pc()))
                    except asyncio.TimeoutError:
                        break
                else:
                    await sem.acquire()
                lags.append((pc() - next_t) * 1000)
                spawn(gated(f"{id_prefix}{sent}", next(prompts), next_t))
                sent += 1
                next_t += next(g)
        else:
            counter = [0]

            async def user() -> None:
                ready = pc()
                while counter[0] < limit and pc() < deadline:
                    counter[0] += 1
                    rid = f"{id_prefix}{counter[0] - 1}"
                    lags.append((pc() - ready) * 1000)
                    await one(rid, next(prompts), ready)
                    ready = pc()

            users = [spawn(user()) for _ in range(shape.concurrency)]
            await asyncio.wait(users, timeout=max(0.0, deadline - pc()))
            sent = counter[0]
        # The window is over: in-flight requests may finish within drain_s, then they are cancelled.
        if inflight:
            if shape.mode == "closed":
                # Users must not start new requests while draining.
                limit = 0
            await asyncio.wait(set(inflight), timeout=window.drain_s)
    finally:
        pending = set(inflight)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        gc.unfreeze()  # frozen only for the window: what dies later is still collected
    return WindowOutcome(sent=sent, elapsed_s=pc() - start, lag_p99_ms=percentile(lags, 99) if lags else 0.0, lag_max_ms=max(lags, default=0.0))
