"""The one percentile definition, for every figure vramlab computes over values.

Linear interpolation between closest ranks (Hyndman & Fan type 7), the default of
`numpy.percentile` and of vLLM's `bench serve`: monotone in p, and equal to the middle value at
P50. The stop condition, the load generator's lag warning, the reports, the drill's signals, the
residency simulation and the calibration's error summary all call this function, so a P95 that
stopped a run is the P95 its report shows for the same requests.

It lives at the bottom (`records`, which imports nothing of vramlab's) so every package may use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float, *, is_sorted: bool = False) -> float:
    """The p-th percentile (0..100) of *values* by linear interpolation (type 7)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= p <= 100.0 or math.isnan(p):
        raise ValueError(f"percentile p must be within 0..100, got {p}")
    xs = values if is_sorted else sorted(values)
    h = (len(xs) - 1) * p / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    frac = h - lo
    if not frac or xs[lo] == xs[hi]:  # also keeps inf (a wait that never ended) from becoming nan
        return xs[lo]
    # a + f*(b - a) is monotone in f under rounding; the clamp keeps it within [a, b] (and finite
    # when b - a overflows), so the whole function stays monotone in p.
    value = xs[lo] + frac * (xs[hi] - xs[lo])
    return min(max(value, xs[lo]), xs[hi])


__all__ = ["percentile"]
