"""Arrival processes for an open loop, and their inter-arrival gaps.

Gaps are gamma-distributed with shape = burstiness and mean 1/rate, as vLLM's `bench serve`
does: burstiness 1 is a Poisson process, below 1 is burstier (coefficient of variation
1/sqrt(burstiness)), above 1 is more regular, and "constant" spaces requests exactly 1/rate apart.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Literal

Arrival = Literal["poisson", "gamma", "constant"]


def gaps(
    rate: float, arrival: Arrival = "poisson", burstiness: float = 1.0, seed: int = 0
) -> Iterator[float]:
    """An endless stream of gaps in seconds (the caller bounds it by count and time)."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if arrival == "constant":
        while True:
            yield 1.0 / rate
    shape = 1.0 if arrival == "poisson" else burstiness
    if shape <= 0:
        raise ValueError("burstiness must be > 0")
    rng = random.Random(seed)
    scale = 1.0 / (rate * shape)
    while True:
        yield rng.gammavariate(shape, scale)


def schedule_gaps(schedule: tuple[float, ...]) -> Iterator[float]:
    """The gaps of a given schedule (a trace's send times, first at 0): after its last request an
    endless gap, so an open loop sends nothing more (the window ends at its own bound)."""
    for a, b in zip(schedule, schedule[1:], strict=False):
        yield max(0.0, b - a)
    while True:
        yield float("inf")


def offsets(
    rate: float, count: int, arrival: Arrival = "poisson", burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """The first ``count`` send times, in seconds from the start of the window (first at 0)."""
    out, t = [], 0.0
    g = gaps(rate, arrival, burstiness, seed)
    for _ in range(count):
        out.append(t)
        t += next(g)
    return out
