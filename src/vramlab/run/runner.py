"""The one runner: experiments and drills alike, rounds of baseline -> steps -> recovery.

It owns the clock, the order of things and where the run is in it (every event's round, phase and
step), the run record, the events and the ending; everything it learns goes out as events (see
events.py) to whoever subscribes: the store writer, the terminal, a test. What a kind of run does
in each part (the experiment's fixed steps and recovery window, the drill's ramp until the target
fails and its recovery) comes from its ``RunKind`` (kind.py): the experiment's is
experiment/kind.py, the drill's drill/kind.py. Neither has a loop of its own.

However the run ends (completed, a stop, an error, the store giving up, Ctrl-C), the same
``finally`` rolls back what the kind changed, then emits ``run_end``. An error is recorded on the
run (an ``error`` event, status failed) and kept on the result, never raised through.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramlab.records import emit as E
from vramlab.records.capacity_plan import CAPACITY_PLAN_NOTE
from vramlab.records.emit import Draft
from vramlab.records.events import EventKind
from vramlab.run.events import Event, EventHook
from vramlab.run.kind import RunKind, Where
from vramlab.run.rollback import RollbackResult
from vramlab.run.stop import StopReason

EXIT_CODES = {"completed": 0, "failed": 1, "stopped": 3, "interrupted": 130}
INTERRUPTED = "interrupted (Ctrl-C or SIGTERM)"


def exit_code(status: str, error: BaseException | None = None, recovered: bool = True) -> int:
    """The one exit-code policy of `vramlab run` and `vramlab drill` (docs/experiments.md, docs/drills.md):
    0 completed (a drill: every failed round recovered), 1 failed once the run had started (or a
    drill's target not recovered), 3 stopped early (a stop condition, a broken baseline, the wall
    clock), 130 interrupted. A run that failed on an error keeps the error's code: a ``VramlabError``
    its own (2: bad input found at the target's start), anything else is a bug in vramlab (70)."""
    if status == "failed" and error is not None:
        from vramlab.errors import VramlabError

        return error.exit_code if isinstance(error, VramlabError) else 70
    if status == "completed" and not recovered:
        return 1
    return EXIT_CODES[status]


# How often a running step asks its kind "should this step end?", and how often the kind's clock
# and sample-based conditions are checked between requests (a hung target sends no results).
POLL_S = 0.05
# every event's data checked against its kind's declared types as it is written (the test suite sets it)
STRICT_EVENTS = os.environ.get("VRAMLAB_STRICT_EVENTS") == "1"


@dataclass(frozen=True)
class RunResult:
    run_id: str
    status: str
    stop_reason: StopReason | None
    notes: tuple[str, ...]
    requests: int
    errors: int
    elapsed_s: float
    rollbacks: tuple[RollbackResult, ...]
    reason: str | None = None  # the run_end's stop_reason in words (a stop, an error, Ctrl-C)
    error: BaseException | None = None  # the error that failed the run, recorded on it

    @property
    def exit_code(self) -> int:
        return exit_code(self.status, self.error)


class _Stopped(Exception):
    pass


class Runner:
    """Runs one run of any kind: ``await Runner(kind, hook).run()``. *capacity_plan*, when given, is
    called once the kind's ``open`` brought the target up (in a thread): the capacity plan's events
    (the session's hook, run/capacity_plan.py)."""

    def __init__(
        self,
        kind: RunKind,
        hook: EventHook | None = None,
        capacity_plan: Callable[[], list[Draft]] | None = None,
    ) -> None:
        self.kind = kind
        self.capacity_plan = capacity_plan
        self.hook = hook or EventHook()
        self.run_id = self.kind.run_id
        self.where = Where()
        self.t0 = time.perf_counter()
        self.notes: list[str] = []
        self.halted: str | None = None  # why the run stops early (status "stopped")
        self.stop: StopReason | None = None  # the stop condition behind it, when one was
        self.aborted: str | None = None  # why the run failed from outside (the store refused its rows)
        self._body: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.kind.attach(self)

    # -- events --------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, draft: Draft, t_s: float | None = None, where: Where | None = None) -> None:
        """One event from its typed draft (vramlab.records.emit), stamped with the run's clock and where
        it is (or *t_s* and *where*: a request's end, a window that has moved on)."""
        w = where or self.where
        if STRICT_EVENTS and draft.data:
            from vramlab.records.event_check import misfits

            if bad := misfits(draft.kind, dict(draft.data)):
                raise TypeError(
                    f"event {draft.kind}: data {', '.join(f'{k}={draft.data[k]!r}' for k in bad)} "
                    "misfit its declared type"
                )
        t = self.now() if t_s is None else t_s
        self.hook.fire(
            Event(draft.kind, t, w.round, w.phase, w.step, draft.message, dict(draft.data), draft.payload)
        )

    def note(self, message: str, by: str | None = None) -> None:
        """A run note (kept on the run row and as an event); *by*: what wrote it (NoteData.by)."""
        self.notes.append(message)
        self.emit(E.NOTE(message, {"by": by} if by else None))

    # -- ending it early -------------------------------------------------------------------------
    def halt(self, message: str, reason: StopReason | None = None) -> None:
        """Stop the run at the next phase or step boundary (status "stopped"); the first reason stands."""
        if self.halted is None:
            self.halted, self.stop = message, reason

    def abort(self, reason: str) -> None:
        """Fail the run now (the store writer's failure): the rounds are cancelled, then the
        ``finally`` rolls back and ends the run as for a stop."""
        if self.aborted is not None:
            return
        self.aborted = reason
        if self._body is not None:
            self._body.cancel()
        self.emit(E.ERROR(reason))

    def abort_soon(self, reason: str) -> None:
        """``abort`` from another thread (the store writer's)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.abort, reason)

    def _halt_check(self) -> None:
        if self.halted is not None or self.aborted is not None:
            raise _Stopped

    # -- the run -------------------------------------------------------------------------------
    async def run(self) -> RunResult:
        kind = self.kind
        self.t0 = time.perf_counter()  # t_s = 0 is started_at: `vramlab note` stamps its notes the same way
        self._loop = asyncio.get_running_loop()
        message, record = await kind.record()
        self.emit(E.run_start(message, record))
        status, reason = "failed", None
        error: BaseException | None = None
        rollbacks: list[RollbackResult] = []
        body = self._body = asyncio.ensure_future(self._rounds())
        try:
            await body
            status = "stopped" if self.halted is not None else "completed"
        except _Stopped:
            status = "stopped"
        except asyncio.CancelledError:
            status, reason = "interrupted", INTERRUPTED
        except Exception as exc:  # recorded on the run and kept on the result (the session says it)
            status, reason, error = "failed", f"{type(exc).__name__}: {exc}"[:300], exc
            self.where = Where()
            self.emit(E.ERROR(reason))
        finally:
            status, reason, rollbacks = await self._finish(status, reason)
        requests, errors = kind.totals()
        return RunResult(
            self.run_id,
            status,
            self.stop,
            tuple(self.notes),
            requests,
            errors,
            self.now(),
            tuple(rollbacks),
            reason,
            error,
        )

    async def _finish(self, status: str, reason: str | None) -> tuple[str, str | None, list[RollbackResult]]:
        if self.aborted is not None:
            status, reason = "failed", self.aborted
        if self.halted is not None and reason is None:
            reason = self.halted
        self.where = Where(phase="rollback")
        rollbacks = await self.kind.rollback(status, reason)
        for err in self.hook.errors:
            self.note(err)
        self.hook.errors.clear()
        self.where = Where()
        self.emit(self.kind.run_end(status, reason))
        return status, reason, rollbacks

    async def _rounds(self) -> None:
        kind = self.kind
        await (
            kind.started()
        )  # inside the guarded body: a start that fails still ends the run (failed, rolled back)
        async with contextlib.AsyncExitStack() as stack:
            await kind.open(stack)
            await self._capacity_plan()
            ticker = asyncio.ensure_future(self._tick())
            stack.push_async_callback(_cancelled, ticker)
            for rnd in kind.rounds:
                self._halt_check()
                self.where = Where(rnd)
                async with kind.round(rnd):
                    self.where = Where(rnd, "baseline", 0)
                    await kind.baseline(rnd)
                    self._halt_check()
                    failed = await self._steps(rnd)
                    self._halt_check()
                    if not failed:
                        await kind.steps_held(rnd)
                        self._halt_check()
                    self.where = Where(rnd, "recovery", 0)
                    await kind.recovery(rnd, failed)
            self._halt_check()
            kind.after_rounds()

    async def _capacity_plan(self) -> None:
        """The capacity plan for the target's own settings (and its start-up memory), as events."""
        if self.capacity_plan is None:
            return
        try:
            emitted = await asyncio.to_thread(self.capacity_plan)
        except Exception as exc:
            self.note(f"capacity plan: {type(exc).__name__}: {exc}"[:300], by=CAPACITY_PLAN_NOTE)
            return
        for draft in emitted:
            if draft.kind == EventKind.NOTE:  # a run note: kept on the run row too
                by = draft.data.get("by")
                self.note(draft.message, by=by if isinstance(by, str) else None)
            else:
                self.emit(draft)

    async def _steps(self, rnd: int) -> bool:
        """The steps of one round (numbered from 1) until the strategy ends them or one fails;
        True when one failed."""
        strategy = self.kind.steps()
        step, value, last = 1, strategy.first(), None
        while value is not None:
            self._halt_check()
            self.where = Where(rnd, self.kind.step_phase, step)
            self.kind.begin_step(step, value)
            if not await self.kind.apply(value):
                return False
            if await self._step(rnd, step, value, last):
                return True
            outcome = self.kind.end_step(step, value)
            self._halt_check()
            step, last = step + 1, value
            value = strategy.next(outcome)
        return False

    async def _step(self, rnd: int, step: int, value: float, last: float | None) -> bool:
        """One step's window, asking the kind every POLL_S whether the step failed; True when it did."""
        kind = self.kind
        window = asyncio.ensure_future(kind.window(rnd, step, value))
        kept = False
        try:
            while not window.done():
                if kind.step_failed():
                    kept = kind.on_step_failure(step, value, last, window)
                    return True
                await asyncio.wait({window}, timeout=POLL_S)
            await window
        finally:
            if not window.done() and not kept:  # a stop or Ctrl-C: the step's load ends here
                await _cancelled(window)
        if kind.step_failed():
            kind.on_step_failure(step, value, last, None)
            return True
        return False

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            self.kind.tick()


async def _cancelled(task: asyncio.Future[Any]) -> None:
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


__all__ = ["EXIT_CODES", "INTERRUPTED", "POLL_S", "RunResult", "Runner", "exit_code"]
