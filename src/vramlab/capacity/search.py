"""Bisection over whole numbers for a property that holds up to some point (the most layers, the
longest context) or from some point on (the fewest experts on the host)."""

from __future__ import annotations

from collections.abc import Callable


def largest(lo: int, hi: int, holds: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] for which *holds* is true, or None when it is false at *lo*."""
    if not holds(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def smallest(lo: int, hi: int, holds: Callable[[int], bool]) -> int | None:
    """The smallest n in [lo, hi] for which *holds* is true, or None when it is false at *hi*."""
    if not holds(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
