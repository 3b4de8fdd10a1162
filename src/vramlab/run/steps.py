"""Step strategies: which values the treatment phase steps through.

``FixedSteps`` walks the plan's list (explicit steps, or a geometric ramp expanded up front). A
stop condition ends the run. Ramping until the target fails is the drill's job (drill/ramp.py and
drill/kind.py, walked by the same runner); it shares this package's stop engine (``StopMonitor``) and rollbacks, not a
second strategy here (the unused ``RampUntilStop``/``TargetControl`` extension points went).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from vramlab.run.stop import StopReason


@dataclass(frozen=True)
class StepOutcome:
    index: int  # 1-based treatment step
    value: float
    requests: int
    errors: int
    p95_e2e_ms: float | None
    stopped: StopReason | None


class StepStrategy(Protocol):
    def first(self) -> float | None: ...

    def next(self, outcome: StepOutcome) -> float | None: ...


class FixedSteps:
    def __init__(self, values: list[float]) -> None:
        self.values = list(values)

    def first(self) -> float | None:
        return self.values[0] if self.values else None

    def next(self, outcome: StepOutcome) -> float | None:
        return self.values[outcome.index] if outcome.index < len(self.values) else None
