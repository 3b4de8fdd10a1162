"""What a kind of run contributes to the one runner (runner.py): its parts, not a loop of its own.

The runner owns the run record and ``run_start``/``run_end``, the events, the rounds, the phase
sequence (baseline -> steps -> after the steps), the step loop and its one polling interval, the
store-failure abort, Ctrl-C and the ``finally`` that rolls back. A kind says what each of those
does for it: the experiment (experiment/standard.py: baseline, fixed treatment steps, a recovery
window) or the OOM drill (drill/kind.py: a ramp until the target fails, then its recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from vramlab.experiment.steps import StepOutcome, StepStrategy

if TYPE_CHECKING:
    from vramlab.experiment.rollback import RollbackResult
    from vramlab.experiment.runner import Runner
    from vramlab.records import RunRecord


@dataclass
class Where:
    """Where the run is now: every event is stamped with it."""

    round: int | None = None
    phase: str | None = None
    step: int | None = None


class RunKind(Protocol):
    """A kind of run, as the runner calls it (in this order)."""

    run_id: str
    rounds: range  # the round numbers, in order
    first_step: int  # the first step's number (the experiment counts treatment steps from 1, a drill from 0)
    raises: (
        bool  # an error or Ctrl-C goes on to the caller after run_end (else: a status, and an "error" event)
    )
    interrupted: str  # the reason a Ctrl-C ends the run with

    def attach(self, run: Runner) -> None:
        """Called once by the runner it belongs to, before anything runs."""

    async def record(self) -> tuple[str, RunRecord]:
        """The run_start line and the run record (at the run's start, t = 0)."""

    async def started(self) -> None:
        """Just after run_start: notes and warnings about the plan, start hooks."""

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        """Bring up what every round uses (load client, samplers, the target); *stack* closes it."""

    def round(self, rnd: int) -> contextlib.AbstractAsyncContextManager[None]:
        """Set up and tear down one round (a drill's client and watchers)."""

    async def baseline(self, rnd: int) -> None:
        """The round's baseline window; halts the run (``Runner.halt``) when it is broken."""

    def steps(self) -> StepStrategy:
        """The values the steps go through."""

    def begin_step(self, rnd: int, step: int, value: float) -> None:
        """Where and what the step is (its events)."""

    async def apply(self, value: float) -> bool:
        """Set the step's value (a drill's knob); False: it cannot go there, the steps end without a failure."""

    async def window(self, rnd: int, step: int, value: float) -> None:
        """The step's load window."""

    def step_failed(self) -> bool:
        """Polled while the step's window runs, and once after it: should the step (and the steps) end?"""

    def on_step_failure(
        self, step: int, value: float, last: float | None, window: asyncio.Future[Any] | None
    ) -> bool:
        """The step failed: say so. True: the kind keeps the still running *window* (to drain it)."""

    def end_step(self, step: int, value: float) -> StepOutcome:
        """What the step got, for the strategy's next value."""

    async def after_steps(self, rnd: int, failed: bool) -> None:
        """After the steps: the experiment's recovery window, a drill's recovery (or its ceiling)."""

    def tick(self) -> None:
        """Every polling interval while the rounds run (wall-clock and sample-based conditions)."""

    def after_rounds(self) -> None:
        """Every round ran to its end (not called on a stop)."""

    async def rollback(self, status: str, reason: str | None) -> list[RollbackResult]:
        """Undo what the run changed, however it ended."""

    def run_end(self, status: str, reason: str | None) -> tuple[str, dict[str, Any]]:
        """The run_end line and its data."""

    def totals(self) -> tuple[int, int]:
        """Requests and errors so far."""


__all__ = ["RunKind", "Where"]
