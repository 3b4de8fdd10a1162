"""What a kind of run contributes to the one runner (runner.py): its parts, not a loop of its own.

The runner owns the run record and ``run_start``/``run_end``, the events, the rounds, the phase
sequence (baseline -> steps -> recovery) and where the run is in it (every event's round, phase and
step: the runner sets them), the step loop and its one polling interval, the store-failure abort,
Ctrl-C and the ``finally`` that rolls back. A kind says what each of those does for it: the
experiment (experiment/kind.py: baseline, fixed treatment steps, a recovery window) or the OOM
drill (drill/kind.py: a ramp until the target fails, then its recovery). This package imports
neither: they plug in.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from vramlab.run.steps import StepOutcome, StepStrategy

if TYPE_CHECKING:
    from vramlab.records import RunRecord
    from vramlab.records.emit import Draft
    from vramlab.run.capacity_plan import PlanFacts
    from vramlab.run.rollback import RollbackResult
    from vramlab.run.runner import Runner


@dataclass
class Where:
    """Where the run is now: every event is stamped with it. Steps are numbered from 1; the
    baseline and the recovery are step 0 (not a step)."""

    round: int | None = None
    phase: str | None = None
    step: int | None = None


class RunKind(Protocol):
    """A kind of run, as the runner calls it (in this order)."""

    run_id: str
    rounds: range  # the round numbers, in order
    step_phase: str  # the phase its steps are stamped with ("treatment", "ramp")
    wall_clock_s: float  # the longest the run may take (the session's watchdog waits past it)

    def attach(self, run: Runner) -> None:
        """Called once by the runner it belongs to, before anything runs."""

    async def record(self) -> tuple[str, RunRecord]:
        """The run_start line and the run record (at the run's start, t = 0)."""

    async def started(self) -> None:
        """Just after run_start: notes and warnings about the plan."""

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        """Bring up what every round uses (load client, samplers, the target); *stack* closes it."""

    def capacity_facts(self) -> PlanFacts:
        """What the capacity model needs about the target (the run's capacity plan, made once it is up)."""

    def round(self, rnd: int) -> contextlib.AbstractAsyncContextManager[None]:
        """Set up and tear down one round (a drill's client and watchers)."""

    async def baseline(self, rnd: int) -> None:
        """The round's baseline window; halts the run (``Runner.halt``) when it is broken."""

    def steps(self) -> StepStrategy:
        """The values the steps go through."""

    def begin_step(self, step: int, value: float) -> None:
        """What the step is (its events)."""

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

    async def steps_held(self, rnd: int) -> None:
        """The steps ended and none failed (at the last step's position): a drill's ceiling."""

    async def recovery(self, rnd: int, failed: bool) -> None:
        """The recovery phase: the experiment's recovery window, a drill's recovery of its failed target."""

    def tick(self) -> None:
        """Every polling interval while the rounds run (wall-clock and sample-based conditions)."""

    def after_rounds(self) -> None:
        """Every round ran to its end (not called on a stop)."""

    async def rollback(self, status: str, reason: str | None) -> list[RollbackResult]:
        """Undo what the run changed, however it ended."""

    def run_end(self, status: str, reason: str | None) -> Draft:
        """The run_end event (`vramlab.records.emit.RUN_END`)."""

    def totals(self) -> tuple[int, int]:
        """Requests and errors so far."""


__all__ = ["RunKind", "Where"]
