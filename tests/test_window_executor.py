"""The one window executor `vramlab run` and `vramlab drill` share (run/window.py), against a
real aiohttp SSE stub on loopback: lanes, the stop flag, cancellation, the records both store."""

from __future__ import annotations

import asyncio
import time

import pytest

from vramlab.load.client import OpenAIClient, RequestResult
from vramlab.load.driver import LoadShape, Window
from vramlab.load.prompts import Prompt
from vramlab.load.retry import RetryPolicy
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.run.window import Lane, WindowExecutor, request_record

P = [Prompt("hello there", 2, 4)]


def _lane(out: list[RequestResult], prefix: str, window: Window, users: int = 1) -> Lane:
    return Lane(P, LoadShape("closed", users, max_tokens=4), window, out.append, prefix)


def test_lanes_run_together_each_with_its_own_ids_and_results() -> None:
    a: list[RequestResult] = []
    b: list[RequestResult] = []

    async def go() -> object:
        async with StubServer(StubBehaviour(ttft_s=0.01)) as srv, OpenAIClient(srv.url, "m") as c:
            ex = WindowExecutor(c)
            return await ex.run(
                [_lane(a, "u0:", Window(requests=3)), _lane(b, "u1:", Window(requests=5))], RetryPolicy()
            )

    outcome = asyncio.run(go())
    assert outcome is not None and outcome.sent == 3  # type: ignore[attr-defined]  # the first lane's outcome
    assert len(a) == 3 and len(b) == 5 and all(r.ok for r in a + b)
    assert all(r.request_id.startswith("u0:") for r in a) and all(r.request_id.startswith("u1:") for r in b)


def test_the_stop_flag_ends_every_lane_and_in_flight_requests_are_recorded() -> None:
    out: list[RequestResult] = []

    async def go() -> tuple[float, object]:
        async with StubServer(StubBehaviour(ttft_s=0.05)) as srv, OpenAIClient(srv.url, "m") as c:
            ex = WindowExecutor(c)
            lanes = [_lane(out, f"u{u}:", Window(duration_s=20.0, drain_s=10.0)) for u in range(3)]
            t = time.perf_counter()
            task = asyncio.ensure_future(ex.run(lanes, RetryPolicy()))
            while len(out) < 6:
                await asyncio.sleep(0.01)
            ex.stop()  # as fire_stop does
            res = await task
            return time.perf_counter() - t, res

    elapsed, outcome = asyncio.run(go())
    assert outcome is not None and outcome.stopped  # type: ignore[attr-defined]
    assert elapsed < 10.0  # neither the 20 s window nor its drain
    assert {r.request_id.split(":")[0] for r in out} == {"u0", "u1", "u2"}


def test_cancelling_the_caller_records_in_flight_requests_then_raises() -> None:
    out: list[RequestResult] = []

    async def go() -> None:
        async with StubServer(StubBehaviour(ttft_s=30.0)) as srv, OpenAIClient(srv.url, "m") as c:
            ex = WindowExecutor(c)
            task = asyncio.ensure_future(
                ex.run([_lane(out, "s:", Window(duration_s=20.0), users=4)], RetryPolicy())
            )
            await asyncio.sleep(0.5)
            task.cancel()  # a drill whose target failed cancels its step's window
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    assert len(out) == 4 and all(r.error_class == "cancelled" for r in out)


def test_cancel_from_outside_ends_the_window_with_no_outcome() -> None:
    async def go() -> object:
        async with StubServer(StubBehaviour(ttft_s=30.0)) as srv, OpenAIClient(srv.url, "m") as c:
            ex = WindowExecutor(c)
            task = asyncio.ensure_future(ex.run([_lane([], "s:", Window(duration_s=20.0))], RetryPolicy()))
            await asyncio.sleep(0.3)
            ex.cancel()  # as Runner.abort does when the store refuses rows
            return await task

    assert asyncio.run(go()) is None


def test_a_worker_pool_takes_one_lane_per_window() -> None:
    lane = _lane([], "x", Window(requests=1))
    with pytest.raises(ValueError, match="one lane per window"):
        asyncio.run(WindowExecutor(pool=object()).run([lane, lane], RetryPolicy()))


def test_request_record_keeps_a_failed_latency_only_when_asked() -> None:
    failed: list[RequestResult] = []

    async def go() -> None:
        async with StubServer(StubBehaviour(fail_status=500)) as srv, OpenAIClient(srv.url, "m") as c:
            await WindowExecutor(c).run([_lane(failed, "f", Window(requests=1))], RetryPolicy())

    asyncio.run(go())
    res = failed[0]
    assert not res.ok and res.e2e_ms > 0
    run = request_record(res, "r1", res.scheduled_at - 1.0, 1, "treatment", 2, 8.0)
    drill = request_record(res, "r1", res.scheduled_at - 1.0, 0, "ramp", 2, 8.0, failed_latency=True)
    assert run.e2e_ms is None and run.e2e_from_scheduled_ms is None  # a run's latency figures count successes
    assert drill.e2e_ms == res.e2e_ms and drill.e2e_from_scheduled_ms == res.e2e_from_scheduled_ms
    assert run.scheduled_s == pytest.approx(1.0) and run.status_code == 500 and run.step_value == 8.0
