"""The largest load that still meets every SLO: bracketing, then bisection, one window a probe. Pure.

A probe (one treatment window at one value) **meets** the SLO when every limit holds (each named
as the plan's thresholds are: ``p95_ttft_ms``, ``p95_itl_ms``, ``error_rate``, ...; measured as the
report measures them, analysis/thresholds.py), it held at least ``min_requests`` requests, and the
load was not past saturation. Saturation is the throughput no longer rising with the load: in a
closed loop, a probe whose throughput rose by less than SATURATED_GAIN of its step over the nearest
lower probe that met the SLO, or whose throughput per user fell below SATURATED_EFFICIENCY of the
best per-user rate of the lower probes that met it (below saturation it rises in step with the
users; past it the added users wait in the engine's queue); in an open loop, a probe that completed
less than SATURATED_RATE of the rate it was offered.

The search starts at ``low`` and doubles while probes meet the SLO (the bracket's top is ``high``);
the first probe that fails closes the bracket, which is then halved until it is no wider than the
resolution (one user for concurrency; 5 % of the bracket's bottom for a rate). A probe whose two
halves disagree (one half's SLO figure over twice the other's and on the other side of the limit)
is probed again once at the same value, and the second decides. The answer is the largest value
that met the SLO, with its bracket: (answer, the smallest value that did not), either end None when
the search did not find it (every probe failed: none meets it from ``low``; every probe met it: up
to ``high`` at least).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramlab.analysis.stats import summarize_requests
from vramlab.analysis.thresholds import observed
from vramlab.records import EventRecord, RequestRecord
from vramlab.records.event_payloads import SearchProbeData
from vramlab.records.events import EventKind, search_probe_data, search_result_data

SATURATED_GAIN = 0.25
SATURATED_RATE = 0.9
SATURATED_EFFICIENCY = 0.8
RATE_RESOLUTION = 0.05


@dataclass(frozen=True)
class Probe:
    value: float
    requests: int
    duration_s: float
    throughput_rps: float
    observed: dict[str, float | None]  # each SLO metric's value in the window
    failed: tuple[str, ...]  # the limits it broke ("too_few_requests", "saturated" included)
    unstable: bool = False  # its halves disagree about an SLO

    @property
    def meets(self) -> bool:
        return not self.failed

    def to_json(self) -> SearchProbeData:
        return {
            "value": self.value,
            "requests": self.requests,
            "duration_s": round(self.duration_s, 3),
            "throughput_rps": round(self.throughput_rps, 3),
            "observed": self.observed,
            "failed": list(self.failed),
            "meets": self.meets,
            "unstable": self.unstable,
        }


def _window(records: Sequence[RequestRecord]) -> float:
    starts = [r.scheduled_s if r.scheduled_s is not None else r.sent_s for r in records]
    ends = [r.end_s for r in records if r.end_s is not None]
    s = [x for x in starts if x is not None]
    return max(ends) - min(s) if s and ends else 0.0


def _figures(
    records: Sequence[RequestRecord], slo: Mapping[str, float]
) -> tuple[dict[str, float | None], float, int]:
    duration = _window(records)
    summary = summarize_requests(records, duration)
    return {k: observed(summary, k) for k in slo}, summary.throughput_rps, summary.count


def _broken(figures: Mapping[str, float | None], slo: Mapping[str, float]) -> list[str]:
    return [k for k, limit in slo.items() if figures.get(k) is None or figures[k] > limit]  # type: ignore[operator]


def probe(
    value: float,
    records: Sequence[RequestRecord],
    slo: Mapping[str, float],
    min_requests: int,
    below: Probe | None = None,
    open_loop: bool = False,
    best_per_user: float | None = None,
) -> Probe:
    """One window's probe; *below*: the nearest lower probe that met the SLO, *best_per_user*: the
    highest throughput per user of the lower probes that met it (both for saturation)."""
    figures, thr, n = _figures(records, slo)
    failed = _broken(figures, slo)
    if n < min_requests:
        failed.append("too_few_requests")
    if open_loop and thr < SATURATED_RATE * value:
        failed.append("saturated")
    elif not open_loop and _saturated(value, thr, below, best_per_user):
        failed.append("saturated")
    return Probe(value, n, _window(records), thr, figures, tuple(failed), _unstable(records, slo))


def _saturated(value: float, thr: float, below: Probe | None, best_per_user: float | None) -> bool:
    """A closed loop past saturation: the throughput rose by less than SATURATED_GAIN of the step in
    users, or each user got less than SATURATED_EFFICIENCY of the best rate a user got below (the
    added users mostly wait in the engine's queue)."""
    if below is not None and value > below.value and below.throughput_rps > 0:
        if thr / below.throughput_rps - 1 < SATURATED_GAIN * (value / below.value - 1):
            return True
    return (
        best_per_user is not None and best_per_user > 0 and thr / value < SATURATED_EFFICIENCY * best_per_user
    )


def _unstable(records: Sequence[RequestRecord], slo: Mapping[str, float]) -> bool:
    """Do the window's halves (by end time) disagree about the SLO: one over twice the other, on the
    other side of its limit? (A probe that started cold, or a stall in one half.)"""
    done = sorted((r for r in records if r.end_s is not None), key=lambda r: r.end_s or 0.0)
    if len(done) < 8:
        return False
    half = len(done) // 2
    a, _, _ = _figures(done[:half], slo)
    b, _, _ = _figures(done[half:], slo)
    for k, limit in slo.items():
        x, y = a.get(k), b.get(k)
        if x is None or y is None or k == "error_rate":
            continue
        lo, hi = min(x, y), max(x, y)
        if hi > 2 * lo and lo <= limit < hi:
            return True
    return False


@dataclass
class SloSearch:
    """Which value to probe next, given the probes so far (one search a round)."""

    low: float
    high: float
    integer: bool  # concurrency: whole users
    resolution: float | None = None
    max_probes: int = 16
    probes: list[Probe] = field(default_factory=list)
    reason: str = ""  # why it ended
    _repeated: set[float] = field(default_factory=set)

    def first(self) -> float:
        self.probes, self.reason, self._repeated = [], "", set()
        return self.low

    def below(self, value: float) -> Probe | None:
        """The nearest lower probe that met the SLO (what saturation is judged against)."""
        met = [p for p in self.probes if p.meets and p.value < value]
        return max(met, key=lambda p: p.value) if met else None

    def best_per_user(self, value: float) -> float | None:
        """The highest throughput per unit of the variable among the lower probes that met the SLO."""
        rates = [p.throughput_rps / p.value for p in self.probes if p.meets and p.value < value]
        return max(rates) if rates else None

    def next(self, p: Probe) -> float | None:
        """Record *p*; the next value to probe, None when the search is over."""
        if p.unstable and p.value not in self._repeated and len(self.probes) < self.max_probes - 1:
            self._repeated.add(p.value)
            self.probes.append(p)
            return p.value  # once more at the same value: the second decides
        self.probes = [q for q in self.probes if q.value != p.value] + [p]
        lo, hi = self.bracket
        if len(self.probes) >= self.max_probes:
            self.reason = f"the probe limit ({self.max_probes}) was reached"
            return None
        if hi is None:  # still bracketing upwards
            if lo is None or lo >= self.high:
                self.reason = "every probe met the SLO, up to high" if lo is not None else "no probe"
                return None
            return self._round(min(self.high, lo * 2), up=True)
        if lo is None:
            self.reason = "the lowest value already breaks the SLO"
            return None
        if hi - lo <= self._resolution(lo):
            self.reason = "the bracket is as narrow as the resolution"
            return None
        mid = self._round((lo + hi) / 2, up=False)
        if mid <= lo or mid >= hi:
            self.reason = "the bracket is as narrow as the resolution"
            return None
        return mid

    def _round(self, v: float, up: bool) -> float:
        if not self.integer:
            return v
        return float(math.ceil(v) if up else math.floor(v))

    def _resolution(self, lo: float) -> float:
        if self.resolution is not None:
            return self.resolution
        return 1.0 if self.integer else RATE_RESOLUTION * lo

    @property
    def bracket(self) -> tuple[float | None, float | None]:
        """(the largest value that met the SLO below every failure, the smallest that failed)."""
        failed = [p.value for p in self.probes if not p.meets]
        hi = min(failed) if failed else None
        met = [p.value for p in self.probes if p.meets and (hi is None or p.value < hi)]
        return (max(met) if met else None), hi

    @property
    def answer(self) -> float | None:
        return self.bracket[0]


def searches(events: Sequence[EventRecord]) -> list[dict[str, Any]]:
    """Each round's SLO search as its events stored it: the answer, its bracket and SLO, every probe
    in the order probed (a round whose search did not end has its probes and no answer)."""
    out: dict[int, dict[str, Any]] = {}
    for e in sorted(events, key=lambda e: e.t_s):
        if e.kind not in (EventKind.SEARCH_PROBE, EventKind.SEARCH_RESULT):
            continue
        rnd = e.round or 0
        one = out.setdefault(rnd, {"round": rnd, "probes": []})
        if e.kind == EventKind.SEARCH_PROBE:
            one["probes"].append(dict(search_probe_data(e)))
        else:
            one.update({k: v for k, v in search_result_data(e).items() if k != "probes"})  # a count
    return [out[k] for k in sorted(out)]


__all__ = [
    "SATURATED_EFFICIENCY",
    "SATURATED_GAIN",
    "SATURATED_RATE",
    "Probe",
    "SloSearch",
    "probe",
    "searches",
]
