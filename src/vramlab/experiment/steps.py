"""Step strategies: which values the treatment phase steps through.

``FixedSteps`` walks the plan's list (explicit steps, or a geometric ramp expanded up front).
``RampUntilStop`` keeps multiplying until a stop condition fires or the ceiling is reached; it
*absorbs* stops in treatment (the stop is the ramp's answer, the run goes on to recovery), which is
what a drill builds on. The wall clock always ends the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from vramlab.experiment.stop import StopReason


@dataclass(frozen=True)
class StepOutcome:
    index: int  # 1-based treatment step
    value: float
    requests: int
    errors: int
    p95_e2e_ms: float | None
    stopped: StopReason | None


class StepStrategy(Protocol):
    absorbs_stops: bool

    def first(self) -> float | None: ...

    def next(self, outcome: StepOutcome) -> float | None: ...


class FixedSteps:
    absorbs_stops = False

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)

    def first(self) -> float | None:
        return self.values[0] if self.values else None

    def next(self, outcome: StepOutcome) -> float | None:
        return self.values[outcome.index] if outcome.index < len(self.values) else None


class RampUntilStop:
    absorbs_stops = True

    def __init__(self, start: float, factor: float, ceiling: float, integral: bool = True) -> None:
        if start <= 0 or factor <= 1 or ceiling < start:
            raise ValueError("a ramp needs start > 0, factor > 1 and ceiling >= start")
        self.start, self.factor, self.ceiling, self.integral = start, factor, ceiling, integral

    def first(self) -> float | None:
        return self.start

    def next(self, outcome: StepOutcome) -> float | None:
        if outcome.stopped is not None or outcome.value >= self.ceiling:
            return None
        nxt = min(outcome.value * self.factor, self.ceiling)
        if self.integral:
            nxt = float(max(int(nxt), int(outcome.value) + 1))
        return min(nxt, self.ceiling)
