"""Which signal went abnormal first, across the user, service and resource layers.

Each signal is a time series with a baseline window before the treatment (the fault step) and a
rule for "abnormal": a fixed threshold, a deviation from its own baseline, or both (whichever
trips first). An onset is only counted from the treatment start T0 on; a signal that was already
outside its threshold during the baseline is reported as noisy, not as a cause.

Honest clocks: a windowed signal carries its raw points, and its onset is its first
evidence: the first raw point inside the crossing window that is itself past the limit (the first
failed request, the first slow one), not the window's edge. With load `levels` (the ramp's steps),
a deviation is judged against the baseline of the same load level (the level's first `settle_s`),
so ordinary queueing at a higher step is not an anomaly; fixed thresholds hold everywhere.

Pure: plain data in, plain data out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from vramlab.records.stats import percentile

Layer = Literal["user", "service", "resource"]
Direction = Literal["up", "down"]
LAYERS: tuple[str, ...] = ("user", "service", "resource")


@dataclass(frozen=True)
class SignalRule:
    """When a value counts as abnormal.

    `threshold`: fixed limit (abnormal above it for "up", below it for "down").
    `deviation`: abnormal when the value moves past baseline ± max(k·σ, rel·|mean|, min_delta).
    `consecutive`: this many abnormal points in a row before an onset is declared (the onset is
    the first of them), so one-sample blips do not win the race.
    """

    direction: Direction = "up"
    threshold: float | None = None
    deviation: bool = True
    k_sigma: float = 4.0
    rel: float = 0.5
    min_delta: float = 0.0
    consecutive: int = 1
    per_level: bool = True  # judge deviations against the same load level (False: counters, any rise counts)


@dataclass(frozen=True)
class Signal:
    name: str
    layer: Layer
    points: tuple[tuple[float, float], ...]  # (t_s, value), any order
    rule: SignalRule = field(default_factory=SignalRule)
    unit: str = ""
    raw: tuple[tuple[float, float], ...] = ()  # the points a windowed signal was built from
    window_s: float = 0.0  # the windows' length (each point stamped at its window's start)


@dataclass(frozen=True)
class Baseline:
    n: int
    mean: float
    stdev: float
    max: float
    min: float


@dataclass(frozen=True)
class Onset:
    name: str
    layer: Layer
    t_s: float
    value: float
    reason: Literal["threshold", "deviation"]
    limit: float
    baseline_mean: float | None
    unit: str = ""

    def describe(self) -> str:
        base = f" (baseline {self.baseline_mean:.4g})" if self.baseline_mean is not None else ""
        return f"{self.name} = {self.value:.4g}{self.unit and ' ' + self.unit} past {self.reason} {self.limit:.4g}{base}"


@dataclass(frozen=True)
class SignalReport:
    t0_s: float
    first: Onset | None
    order: tuple[Onset, ...]  # every onset, earliest first (the first is `first`)
    quiet: tuple[str, ...]  # signals that stayed normal after T0
    noisy: tuple[str, ...]  # signals already past their fixed threshold in the baseline
    first_by_layer: dict[str, Onset | None]


def baseline_of(points: Iterable[tuple[float, float]], start_s: float, end_s: float) -> Baseline | None:
    vals = [v for t, v in points if start_s <= t < end_s and math.isfinite(v)]
    if not vals:
        return None
    sd = statistics.pstdev(vals) if len(vals) > 1 else 0.0
    return Baseline(len(vals), statistics.fmean(vals), sd, max(vals), min(vals))


def limits(rule: SignalRule, base: Baseline | None) -> list[tuple[str, float]]:
    """The limits a value is judged against: [(reason, limit)]."""
    out: list[tuple[str, float]] = []
    if rule.threshold is not None:
        out.append(("threshold", rule.threshold))
    if rule.deviation and base is not None:
        margin = max(rule.k_sigma * base.stdev, rule.rel * abs(base.mean), rule.min_delta)
        out.append(("deviation", base.mean + margin if rule.direction == "up" else base.mean - margin))
    return out


def _past(rule: SignalRule, value: float, limit: float) -> bool:
    return value > limit if rule.direction == "up" else value < limit


def onset_of(
    sig: Signal,
    t0_s: float,
    baseline_start_s: float,
    end_s: float = math.inf,
    levels: Sequence[tuple[float, float]] = (),
    settle_s: float = 1.0,
) -> Onset | None:
    """The first abnormal point of one signal in [t0_s, end_s), judged against [baseline_start_s, t0_s)
    or, inside one of `levels`, against that level's first `settle_s` seconds."""
    pts = sorted(sig.points)
    base = baseline_of(pts, baseline_start_s, t0_s)
    if sig.rule.threshold is not None and any(
        _past(sig.rule, v, sig.rule.threshold) for t, v in pts if baseline_start_s <= t < t0_s
    ):
        # already past its fixed threshold before the treatment: crossing it again is no anomaly;
        # only a move off its own baseline (the deviation rule) can make it abnormal
        sig = replace(sig, rule=replace(sig.rule, threshold=None))
    thresholds_only = SignalRule(
        direction=sig.rule.direction,
        threshold=sig.rule.threshold,
        deviation=False,
        consecutive=sig.rule.consecutive,
    )
    cache: dict[tuple[float, float], tuple[list[tuple[str, float]], Baseline | None]] = {}

    def judged(t: float) -> tuple[list[tuple[str, float]], Baseline | None]:
        if not levels or not sig.rule.deviation or not sig.rule.per_level:
            return limits(sig.rule, base), base
        seg = next(((a, b) for a, b in levels if a <= t < b), None)
        if seg is None:
            return limits(sig.rule, base), base
        if seg not in cache:
            lb = baseline_of(pts, seg[0], seg[0] + settle_s)
            cache[seg] = (limits(sig.rule if lb else thresholds_only, lb), lb)
        lims, lb = cache[seg]
        if t < seg[0] + settle_s:  # the level's own baseline: only fixed thresholds judge it
            return limits(thresholds_only, None), lb
        return lims, lb

    run: list[tuple[float, float, str, float, Baseline | None]] = []
    for t, v in pts:
        if t < t0_s or t >= end_s or not math.isfinite(v):
            continue
        lims, used = judged(t)
        hit = next(((r, lim) for r, lim in lims if _past(sig.rule, v, lim)), None)
        if hit is None:
            run = []
            continue
        run.append((t, v, hit[0], hit[1], used))
        if len(run) >= max(1, sig.rule.consecutive):
            t1, v1, reason, lim, b = run[0]
            return Onset(
                sig.name,
                sig.layer,
                _first_evidence(sig, t1, lim),
                v1,
                reason,  # type: ignore[arg-type]
                lim,
                b.mean if b else None,
                sig.unit,
            )
    return None


def _first_evidence(sig: Signal, t: float, limit: float) -> float:
    """Inside the window stamped *t*, the time of the first raw point past *limit* (else the first raw
    point at all): the onset is when the evidence was there, not the window's edge."""
    if not sig.raw or sig.window_s <= 0:
        return t
    inside = sorted((rt, rv) for rt, rv in sig.raw if t <= rt < t + sig.window_s)
    past = next((rt for rt, rv in inside if _past(sig.rule, rv, limit)), None)
    if past is not None:
        return past
    return inside[0][0] if inside else t


def first_abnormal(
    signals: Sequence[Signal],
    t0_s: float,
    baseline_start_s: float,
    end_s: float = math.inf,
    levels: Sequence[tuple[float, float]] = (),
    settle_s: float = 1.0,
) -> SignalReport:
    """Judge every signal; the earliest onset is the first abnormal signal. Ties go to the layer
    nearest the user (user, then service, then resource), the order a reader should look in."""
    onsets: list[Onset] = []
    quiet: list[str] = []
    noisy: list[str] = []
    for sig in signals:
        if sig.rule.threshold is not None:
            base_pts = [(t, v) for t, v in sig.points if baseline_start_s <= t < t0_s]
            if any(_past(sig.rule, v, sig.rule.threshold) for _, v in base_pts):
                noisy.append(sig.name)
        o = onset_of(sig, t0_s, baseline_start_s, end_s, levels, settle_s)
        if o is None:
            quiet.append(sig.name)
        else:
            onsets.append(o)
    onsets.sort(key=lambda o: (o.t_s, LAYERS.index(o.layer), o.name))
    by_layer: dict[str, Onset | None] = {}
    for layer in LAYERS:
        by_layer[layer] = next((o for o in onsets if o.layer == layer), None)
    return SignalReport(
        t0_s=t0_s,
        first=onsets[0] if onsets else None,
        order=tuple(onsets),
        quiet=tuple(sorted(quiet)),
        noisy=tuple(sorted(noisy)),
        first_by_layer=by_layer,
    )


def event_signal(name: str, layer: Layer, times_s: Iterable[float], unit: str = "") -> Signal:
    """A discrete event (process exit, OOM log line, Xid) as a signal: 1 at each event, abnormal at once."""
    pts = tuple((t, 1.0) for t in times_s)
    return Signal(name, layer, pts, SignalRule(direction="up", threshold=0.5, deviation=False), unit)


def windowed(
    times_values: Iterable[tuple[float, float]], start_s: float, end_s: float, window_s: float, how: str
) -> tuple[tuple[float, float], ...]:
    """Bucket raw points into windows [t, t+window): how = "mean" | "p95" | "max" | "count" | "rate".
    The point is stamped at the window's start, so an onset time is never later than the data."""
    if window_s <= 0 or end_s <= start_s:
        return ()
    n = int(math.ceil((end_s - start_s) / window_s))
    buckets: list[list[float]] = [[] for _ in range(n)]
    for t, v in times_values:
        if start_s <= t < end_s:
            buckets[min(n - 1, int((t - start_s) / window_s))].append(v)
    out: list[tuple[float, float]] = []
    for i, b in enumerate(buckets):
        t = start_s + i * window_s
        if how == "count":
            out.append((t, float(len(b))))
        elif how == "rate":
            out.append((t, len(b) / window_s))
        elif not b:
            continue
        elif how == "mean":
            out.append((t, statistics.fmean(b)))
        elif how == "max":
            out.append((t, max(b)))
        elif how == "p95":
            out.append((t, percentile(b, 95)))
        else:
            raise ValueError(f"unknown aggregation {how!r}")
    return tuple(out)


__all__ = [
    "LAYERS",
    "Baseline",
    "Onset",
    "Signal",
    "SignalReport",
    "SignalRule",
    "baseline_of",
    "event_signal",
    "first_abnormal",
    "limits",
    "onset_of",
    "windowed",
]
