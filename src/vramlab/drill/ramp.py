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


def ramp_values(spec: RampSpec) -> list[float]:
    """Step values from start up to the ceiling. The ceiling is always the last step, so a drill
    that never fails has really tried the ceiling ("no OOM up to X" is then true)."""
    out: list[float] = []
    v = spec.start
    integral = _integral(spec)
    while v < spec.ceiling and len(out) <= MAX_STEPS:
        value = float(math.floor(v)) if integral else v
        if not out or value > out[-1]:
            out.append(value)
        v = v * spec.factor if spec.mode == "geometric" else v + (spec.step or 0.0)
    if not out or out[-1] < spec.ceiling:
        out.append(float(math.floor(spec.ceiling)) if integral else spec.ceiling)
    return out


class RampSteps(FixedSteps):
    """The drill's step strategy: the ramp's values in order, the ceiling last."""

    def __init__(self, spec: RampSpec) -> None:
        super().__init__(ramp_values(spec))


def _integral(spec: RampSpec) -> bool:
    # Tokens, requests and models are whole; balloon GiB may be fractional.
    return spec.knob != "balloon"


__all__ = ["KNOB_UNITS", "MAX_STEPS", "Knob", "RampSpec", "RampSteps", "ramp_values"]
