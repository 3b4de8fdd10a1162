"""The open loop's timerfd alarm (load/alarm.py): never early, in deadline order, cancellable,
and gone with its window. Lateness is not asserted (a busy machine); benchmarks/loadgen.py
measures it against a bare process's wake-ups."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from vramlab.load import driver as driver_mod
from vramlab.load.alarm import Alarm
from vramlab.load.driver import LoadShape, Window, drive
from vramlab.load.prompts import Prompt, cycle

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")


def _runners() -> list[Callable[[Coroutine[Any, Any, Any]], Any]]:
    runners: list[Callable[[Coroutine[Any, Any, Any]], Any]] = [asyncio.run]
    try:
        import uvloop

        runners.append(uvloop.run)
    except ImportError:
        pass
    return runners


@pytest.mark.parametrize("run", _runners())
def test_sleepers_wake_at_or_after_their_time_in_deadline_order(
    run: Callable[[Coroutine[Any, Any, Any]], Any],
) -> None:
    """60 sleepers armed out of order: each returns no earlier than its own time (the loop's own
    timers on uvloop can return up to a millisecond early), and they return sorted by deadline."""

    async def go() -> list[tuple[float, float]]:
        alarm = Alarm.open()
        assert alarm is not None
        start, rng = time.perf_counter() + 0.02, random.Random(3)
        woke: list[tuple[float, float]] = []

        async def sleeper(t: float) -> None:
            await alarm.until(t)
            woke.append((t, time.perf_counter()))

        try:
            await asyncio.gather(*(sleeper(start + rng.uniform(0, 0.15)) for _ in range(60)))
        finally:
            alarm.close()
        return woke

    woke = run(go())
    assert len(woke) == 60
    assert all(at >= t for t, at in woke), [round((at - t) * 1e6) for t, at in woke if at < t]
    assert [t for t, _ in woke] == sorted(t for t, _ in woke)


def test_a_past_deadline_returns_at_once_and_a_cancelled_sleeper_leaves_the_rest() -> None:
    async def go() -> tuple[bool, bool]:
        alarm = Alarm.open()
        assert alarm is not None
        try:
            await asyncio.wait_for(alarm.until(time.perf_counter() - 1.0), timeout=2.0)
            t = time.perf_counter()
            doomed = asyncio.ensure_future(alarm.until(t + 0.03))  # the earliest: the one the fd is armed for
            kept = asyncio.ensure_future(alarm.until(t + 0.06))
            await asyncio.sleep(0)
            doomed.cancel()
            await asyncio.wait_for(kept, timeout=2.0)
            return doomed.cancelled(), time.perf_counter() >= t + 0.06
        finally:
            alarm.close()

    assert asyncio.run(go()) == (True, True)


def test_close_cancels_the_waiting_and_closes_the_descriptor() -> None:
    async def go() -> tuple[bool, int]:
        alarm = Alarm.open()
        assert alarm is not None
        waiting = asyncio.ensure_future(alarm.until(time.perf_counter() + 60))
        await asyncio.sleep(0)
        alarm.close()
        await asyncio.gather(waiting, return_exceptions=True)
        return waiting.cancelled(), alarm.fd

    cancelled, fd = asyncio.run(go())
    assert cancelled
    with pytest.raises(OSError):
        os.fstat(fd)


class _Instant:
    """A sender that answers at once; it records when each request went out against its schedule."""

    def __init__(self) -> None:
        self.late_s: list[float] = []

    async def send(
        self, request_id: str, prompt: Prompt, max_tokens: int, scheduled_at: float, attempt: int = 0
    ) -> Any:
        from vramlab.load.client import RequestResult

        now = time.perf_counter()
        self.late_s.append(now - scheduled_at)
        return RequestResult(request_id, attempt, scheduled_at, now, now, status_code=200)


def test_the_open_loop_sleeps_on_one_alarm_and_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of an open loop opens one alarm, sends nothing before its scheduled time, and closes
    the alarm when it ends (no descriptor left behind for a drill's hundreds of windows)."""
    opened: list[Alarm] = []
    real_open = Alarm.open

    def counting_open() -> Alarm | None:
        a = real_open()
        assert a is not None
        opened.append(a)
        return a

    monkeypatch.setattr(driver_mod.Alarm, "open", staticmethod(counting_open))
    sender = _Instant()
    asyncio.run(
        drive(
            sender,
            cycle([Prompt("hi", 1, 1)]),
            LoadShape("open", 8, 200.0, "poisson", seed=5),
            Window(requests=40, drain_s=1.0),
            lambda r: None,
        )
    )
    assert len(sender.late_s) == 40 and min(sender.late_s) >= 0
    assert len(opened) == 1
    with pytest.raises(OSError):
        os.fstat(opened[0].fd)
