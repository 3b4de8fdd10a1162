"""The one runner: experiments and drills alike, rounds of baseline -> steps -> what follows them.

It owns the clock, the order of things, the run record, the events and the ending; everything it
learns goes out as events (see events.py) to whoever subscribes: the store writer, the terminal, a
test. What a kind of run does in each part (the experiment's fixed steps and recovery window, the
drill's ramp until the target fails and its recovery) comes from its ``RunKind`` (parts.py): the
experiment's is standard.py, the drill's drill/kind.py. Neither has a loop of its own.

However the run ends (completed, a stop, an error, the store giving up, Ctrl-C), the same
``finally`` rolls back what the kind changed, then emits ``run_end``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from vramlab.experiment.events import Event, EventHook
from vramlab.experiment.parts import RunKind, Where
from vramlab.experiment.plan import Plan
from vramlab.experiment.rollback import RollbackResult
from vramlab.experiment.standard import ExperimentKind, RunOptions, _WindowStats
from vramlab.experiment.stop import StopReason

EXIT_CODES = {"completed": 0, "failed": 1, "stopped": 3, "interrupted": 130}

# How often a running step asks its kind "should this step end?", and how often the kind's clock
# and sample-based conditions are checked between requests (a hung target sends no results).
POLL_S = 0.05


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

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


class _Stopped(Exception):
    pass


class Runner:
    """Runs one run of any kind: ``Runner(plan, hook, options)`` an experiment, ``Runner(kind, hook)`` any kind."""

    def __init__(
        self, kind: Plan | RunKind, hook: EventHook | None = None, options: RunOptions | None = None
    ) -> None:
        self.kind: RunKind = ExperimentKind(kind, options or RunOptions()) if isinstance(kind, Plan) else kind
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

    def emit(
        self,
        kind: str,
        message: str = "",
        data: dict[str, Any] | None = None,
        payload: Any = None,
        **fields: Any,
    ) -> None:
        """One event, stamped with the run's clock and where it is; its data as a dict, or as keywords."""
        w = self.where
        self.hook.fire(
            Event(kind, self.now(), w.round, w.phase, w.step, message, {**(data or {}), **fields}, payload)
        )

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.emit("note", message)

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
        self.emit("error", reason)

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
        self.emit("run_start", message, payload=record)
        status, reason = "failed", None
        error: BaseException | None = None
        rollbacks: list[RollbackResult] = []
        body = self._body = asyncio.ensure_future(self._rounds())
        try:
            await body
            status = "stopped" if self.halted is not None else "completed"
        except _Stopped:
            status = "stopped"
        except asyncio.CancelledError as exc:
            status, reason = "interrupted", kind.interrupted
            error = None if self.aborted is not None else exc
        except Exception as exc:  # recorded on the run; a kind that raises hands it on after run_end
            status, reason, error = "failed", f"{type(exc).__name__}: {exc}"[:300], exc
            if not kind.raises:
                self.where = Where()
                self.emit("error", reason)
        finally:
            status, reason, rollbacks = await self._finish(status, reason)
        if error is not None and kind.raises:
            raise error
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
        )

    async def _finish(self, status: str, reason: str | None) -> tuple[str, str | None, list[RollbackResult]]:
        if self.aborted is not None:
            status, reason = "failed", self.aborted
        if self.halted is not None and reason is None:
            reason = self.halted
        rollbacks = await self.kind.rollback(status, reason)
        for err in self.hook.errors:
            self.note(err)
        self.hook.errors.clear()
        message, data = self.kind.run_end(status, reason)
        self.emit("run_end", message, data)
        return status, reason, rollbacks

    async def _rounds(self) -> None:
        kind = self.kind
        await (
            kind.started()
        )  # inside the guarded body: a start hook that fails still ends the run (failed, rolled back)
        async with contextlib.AsyncExitStack() as stack:
            await kind.open(stack)
            ticker = asyncio.ensure_future(self._tick())
            stack.push_async_callback(_cancelled, ticker)
            for rnd in kind.rounds:
                self._halt_check()
                async with kind.round(rnd):
                    await kind.baseline(rnd)
                    self._halt_check()
                    failed = await self._steps(rnd)
                    self._halt_check()
                    await kind.after_steps(rnd, failed)
            self._halt_check()
            kind.after_rounds()

    async def _steps(self, rnd: int) -> bool:
        """The steps of one round until the strategy ends them or one fails; True when one failed."""
        strategy = self.kind.steps()
        step, value, last = self.kind.first_step, strategy.first(), None
        while value is not None:
            self._halt_check()
            self.kind.begin_step(rnd, step, value)
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


__all__ = ["EXIT_CODES", "POLL_S", "RunOptions", "RunResult", "Runner", "_WindowStats"]
