"""One load window, for `vramlab run` and `vramlab drill` alike: the one place a window runs.

A window is one or more lanes of load (`load.drive` loops) against one client or worker pool,
started together and ended together: by their own bounds, by the stop flag (``stop()``: nothing
more is sent, in-flight requests are cancelled and recorded as such), or by cancelling it (Ctrl-C,
a store that refuses rows, a drill whose target failed; in-flight requests are recorded too).
Every result goes to its lane's ``on_result``, where the caller feeds the shared stop engine
(``StopMonitor``, directly or through the drill's detector); ``request_record`` turns a result
into the stored row both use, and ``client_lag`` is the load generator's own check on itself.

The experiment's parts (standard.py) run one lane per window; the drill's (drill/kind.py) one
closed-loop user per lane plus, for the batch knob, a burst lane.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vramlab.load.client import RequestResult
from vramlab.load.driver import LoadShape, Window, WindowOutcome, drive
from vramlab.load.prompts import FreshPrompts, Prompt, cycle
from vramlab.load.retry import RetryPolicy
from vramlab.records import RequestRecord
from vramlab.records.event_payloads import ClientLagData


@dataclass(frozen=True)
class Lane:
    """One `load.drive` loop inside a window: what it sends, how, for how long, and where results go."""

    prompts: list[Prompt] | FreshPrompts  # a list is cycled; fresh prompts are new every request
    shape: LoadShape
    window: Window
    on_result: Callable[[RequestResult], None]
    id_prefix: str


class WindowExecutor:
    """Runs windows on one load client (or a pool of worker processes), one window at a time."""

    def __init__(self, client: Any = None, pool: Any = None, workers: int = 1) -> None:
        self.client = client
        self.pool = pool  # a load.workers.WorkerPool: the load split over processes, one lane per window
        self.workers = workers
        self._task: asyncio.Future[Any] | None = None
        self._flag: asyncio.Event | None = None
        self._end: asyncio.Event | None = None
        self._end_drain_s: float | None = None

    def use(self, client: Any = None, pool: Any = None, workers: int = 1) -> None:
        self.client, self.pool, self.workers = client, pool, workers

    async def run(
        self,
        lanes: Sequence[Lane],
        retry: RetryPolicy,
        *,
        end_drain_s: float | None = None,
    ) -> WindowOutcome | None:
        """Run the lanes to their end. Returns the first lane's outcome, None when the window was
        cancelled (``cancel()``). Cancelling the caller cancels the window; its in-flight requests
        are recorded (as cancelled) before the CancelledError goes on. ``end()`` ends it early as
        at its deadline, its in-flight requests given ``end_drain_s`` to finish or time out."""
        flag = self._flag = asyncio.Event()
        end = self._end = asyncio.Event()
        if self.pool is not None:
            if len(lanes) != 1:
                raise ValueError(f"a worker pool runs one lane per window, not {len(lanes)}")
            lane = lanes[0]
            if isinstance(lane.prompts, FreshPrompts):
                raise ValueError("a worker pool sends a list of prompts, not fresh prompts")
            coro: Any = self.pool.drive(
                lane.prompts,
                lane.shape,
                lane.window,
                lane.on_result,
                retry,
                lane.id_prefix,
                stop=flag,
            )
        else:
            if self.client is None:
                raise RuntimeError("the window executor has no load client")
            coro = _together(
                [
                    drive(
                        self.client,
                        lane.prompts.stream(i)
                        if isinstance(lane.prompts, FreshPrompts)
                        else cycle(lane.prompts),
                        lane.shape,
                        lane.window,
                        lane.on_result,
                        retry,
                        id_prefix=lane.id_prefix,
                        stop=flag,
                        end=end,
                        end_drain_s=end_drain_s,
                    )
                    for i, lane in enumerate(lanes)
                ]
            )
        task = self._task = asyncio.ensure_future(coro)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()  # the caller was cancelled: end the window so its in-flight requests are recorded
            await asyncio.gather(task, return_exceptions=True)
            raise
        finally:
            self._task = None
            self._flag = None
            self._end = None
        if task.cancelled():
            return None
        out = task.result()  # a bug in the driver surfaces here
        return out if isinstance(out, WindowOutcome) else (out[0] if out else None)

    def stop(self) -> None:
        """The stop flag: every loop, in every worker, sends nothing more from here on. The pool is
        told now, not when this loop next runs its drive (a loop busy with results is late)."""
        if self._flag is not None:
            self._flag.set()
            if self.pool is not None:
                self.pool.stop()

    def end(self) -> None:
        """End the running window as at its deadline: nothing new is sent; what is in flight may
        finish (or time out) within the run's ``end_drain_s``."""
        if self._end is not None:
            self._end.set()

    def cancel(self) -> None:
        """End the running window now (its run() returns None)."""
        if self._task is not None:
            self._task.cancel()

    def client_lag(self, outcome: WindowOutcome, warn_ms: float) -> list[ClientLagData]:
        """The load generator's self-check, per worker: did it keep up with its schedule and its tokens?"""
        if self.pool is not None:
            views = [
                (f"load worker {r.worker} of {self.workers} (pid {r.pid})", r.worker, r.pid, r.outcome)
                for r in self.pool.reports
            ]
        else:
            views = [(f"the load client (pid {os.getpid()})", 0, os.getpid(), outcome)]
        return [
            {
                "name": name,
                "worker": idx,
                "pid": pid,
                "dispatch_lag_p99_ms": round(o.lag_p99_ms, 3),
                "loop_lag_p99_ms": round(o.loop_lag_p99_ms, 3),
                "loop_lag_max_ms": round(o.loop_lag_max_ms, 3),
                "saturated": o.lag_p99_ms > warn_ms or o.loop_lag_p99_ms > warn_ms,
            }
            for name, idx, pid, o in views
        ]


async def _together(drives: list[Any]) -> list[WindowOutcome]:
    # A coroutine, not a bare gather future, so the window's task reads as cancelled when cancelled.
    return list(await asyncio.gather(*drives))


_REQUEST_FIELDS = set(RequestRecord.model_fields)


def request_record(
    res: RequestResult,
    run_id: str,
    t0: float,
    rnd: int,
    phase: str,
    step: int,
    value: float | None,
    *,
    failed_latency: bool = False,
) -> RequestRecord:
    """The stored row for one result, times relative to the run's start *t0*. A failed request's
    e2e latencies are kept only with *failed_latency* (the drill's detector reads how long a
    timeout took); a run's latency figures count successes only.

    This is the hot path (thousands a second): every field is given (the assert), and pydantic-core
    validates a record in ~10 us, faster than `model_construct`; nothing writes pydantic's private attributes."""
    ok = res.ok
    keep = ok or failed_latency
    fields = dict(
        run_id=run_id,
        round=rnd,
        phase=phase,
        step=step,
        step_value=value,
        request_id=res.request_id,
        attempt=res.attempt,
        scheduled_s=res.scheduled_at - t0,
        sent_s=res.sent_at - t0,
        first_token_s=None if res.first_token_at is None else res.first_token_at - t0,
        end_s=res.end_at - t0,
        ttft_ms=res.ttft_ms,
        tpot_ms=res.tpot_ms,
        e2e_ms=res.e2e_ms if keep else None,
        e2e_from_scheduled_ms=res.e2e_from_scheduled_ms if keep else None,
        ttft_from_scheduled_ms=res.ttft_from_scheduled_ms,
        dispatch_lag_ms=res.dispatch_lag_ms,
        itl_ms=res.itl_ms,
        itl_untimed_gaps=res.untimed_gaps,
        prompt_tokens=res.prompt_tokens,
        prompt_tokens_source=res.prompt_tokens_source,
        output_tokens=res.output_tokens,
        output_tokens_source=res.output_tokens_source,
        reasoning_tokens=res.reasoning_tokens,
        status_code=res.status_code,
        error_class=res.error_class,
        error=res.error,
        cached_tokens=res.cached_tokens,
        conversation=res.conversation,
        turn=res.turn,
        tenant=res.tenant,
    )
    assert fields.keys() == _REQUEST_FIELDS, fields.keys() ^ _REQUEST_FIELDS
    return RequestRecord.model_validate(fields)


__all__ = ["Lane", "WindowExecutor", "request_record"]
