"""Ramp strategies: which knob a drill turns, and the values it steps through up to a ceiling.

Pure: a ramp is a list of step values, walked by ``RampSteps``, a step strategy of the experiment
runner's kind (``run.steps.StepStrategy``); applying a value to load settings or to a
co-tenant happens in the drill's parts (drill/kind.py, drill/lifecycle.py). The runner's step loop
ends the ramp when the drill's detector says the target failed, as a stop condition ends a run.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from vramlab.run.steps import FixedSteps

Knob = Literal["context", "concurrency", "batch", "coloaded_model", "balloon"]

# What one unit of each knob means, for reports ("no OOM up to 65536 prompt tokens").
KNOB_UNITS: dict[str, str] = {
    "context": "prompt tokens",
    "concurrency": "concurrent requests",
    "batch": "requests per burst",
    "coloaded_model": "co-loaded models",
    "balloon": "GiB held by the balloon",
}

MAX_STEPS = 200  # a ramp is a handful of steps; a typo such as factor: 1.0001 must not run all night
# What one load client (one event loop, a drill's) holds: every closed-loop user is a lane with its
# own few tasks, and the load generator times about 1,000 streams per core right (load/workers.py).
# Past this a step's start-up and its cancellation outlast the step and the wall clock: on a loaded
# 2-core machine 8,192 users took 17 s to run a 2 s window, 4,096 ended 13 s after the wall clock,
# and 65,536 held 1.3 GiB and ran past it by a minute. The stream knobs' ramps stop here, said so.
MAX_STREAMS = 2048
STREAM_KNOBS = ("concurrency", "batch")


class RampSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    knob: Knob = "context"
    mode: Literal["geometric", "linear"] = "geometric"
    start: float
    factor: float = 2.0  # geometric
    step: float | None = None  # linear
    ceiling: float
    step_s: float = 5.0  # how long each step holds before the next
    model: str | None = None  # coloaded_model: what to load next to the target

    @model_validator(mode="after")
    def _check(self) -> RampSpec:
        if self.start <= 0:
            raise ValueError("ramp.start must be > 0")
        if self.ceiling < self.start:
            raise ValueError(f"ramp.ceiling ({self.ceiling:g}) is below ramp.start ({self.start:g})")
        whole = [(k, v) for k, v in (("start", self.start), ("ceiling", self.ceiling)) if v != math.floor(v)]
        if _integral(self) and whole and self.ceiling <= 1e15:  # a huge ceiling is capped, not stepped to
            raise ValueError(
                f"ramp.{whole[0][0]} {whole[0][1]:g}: {self.knob} counts whole {self.unit}; give a whole number"
            )
        if self.knob in STREAM_KNOBS and self.start > MAX_STREAMS:
            raise ValueError(
                f"ramp.start ({self.start:g}) is past the {MAX_STREAMS:,} streams one load client holds"
            )
        if self.mode == "geometric" and self.factor <= 1.0:
            raise ValueError("ramp.factor must be > 1 for a geometric ramp")
        if self.mode == "linear" and (self.step is None or self.step <= 0):
            raise ValueError("a linear ramp needs ramp.step > 0")
        if self.step_s <= 0:
            raise ValueError("ramp.step_s must be > 0")
        if len(ramp_values(self)) > MAX_STEPS:
            raise ValueError(
                f"the ramp has more than {MAX_STEPS} steps; raise factor/step or lower the ceiling"
            )
        return self

    @property
    def unit(self) -> str:
        return KNOB_UNITS[self.knob]

    @property
    def top(self) -> float:
        """The ceiling the ramp really climbs to: the plan's, or MAX_STREAMS for a stream knob."""
        return min(self.ceiling, MAX_STREAMS) if self.knob in STREAM_KNOBS else self.ceiling

    def capped_note(self) -> str | None:
        """What the plan is told when its ceiling is past what the load client holds."""
        if self.top >= self.ceiling:
            return None
        return (
            f"ramp.ceiling {self.ceiling:g} {self.unit} is past the {MAX_STREAMS:,} streams one load "
            f"client holds: the ramp stops at {MAX_STREAMS:,} (a drill that never fails says so up to there)"
        )


def ramp_values(spec: RampSpec) -> list[float]:
    """Step values from start up to the ceiling. The ceiling is always the last step, so a drill
    that never fails has really tried the ceiling ("no OOM up to X" is then true)."""
    out: list[float] = []
    v, ceiling = spec.start, spec.top
    integral = _integral(spec)
    while v < ceiling and len(out) <= MAX_STEPS:
        value = float(math.floor(v)) if integral else v
        if not out or value > out[-1]:
            out.append(value)
        v = v * spec.factor if spec.mode == "geometric" else v + (spec.step or 0.0)
    if not out or out[-1] < ceiling:
        out.append(float(math.floor(ceiling)) if integral else ceiling)
    return out


class RampSteps(FixedSteps):
    """The drill's step strategy: the ramp's values in order, the ceiling last."""

    def __init__(self, spec: RampSpec) -> None:
        super().__init__(ramp_values(spec))


def _integral(spec: RampSpec) -> bool:
    # Tokens, requests and models are whole; balloon GiB may be fractional.
    return spec.knob != "balloon"


__all__ = ["KNOB_UNITS", "MAX_STEPS", "MAX_STREAMS", "Knob", "RampSpec", "RampSteps", "ramp_values"]
