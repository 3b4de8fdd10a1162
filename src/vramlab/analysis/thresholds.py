"""The plan's metric thresholds (`metrics:` in the plan) checked window by window.

Names, as the plan validates them: `{p50,p90,p95,p99,max,mean}_{ttft,tpot,itl,e2e}_ms` (an upper
limit on that statistic), `error_rate` (upper limit) and `min_goodput_rps` (lower limit). The
latency limits double as the per-request SLO for goodput: a request is good when it succeeded
and none of its latencies passes the tightest limit given for that latency.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vramlab.analysis.stats import RequestSummary, Slo
from vramlab.analysis.windows import WindowResult

_LATENCY = re.compile(r"^(p50|p90|p95|p99|max|mean)_(ttft|tpot|itl|e2e)_ms$")


def slo_from_metrics(metrics: Mapping[str, float]) -> Slo | None:
    limits: dict[str, float] = {}
    for name, limit in metrics.items():
        m = _LATENCY.match(name)
        if m and m.group(2) in ("ttft", "tpot", "e2e"):
            key = f"{m.group(2)}_ms"
            limits[key] = min(limits.get(key, float(limit)), float(limit))
    return Slo(**limits) if limits else None


def observed(summary: RequestSummary, name: str) -> float | None:
    """The window's value of a threshold's metric, or None when it cannot be measured."""
    if name == "error_rate":
        return summary.error_rate if summary.count else None
    if name == "min_goodput_rps":
        return summary.goodput_rps
    m = _LATENCY.match(name)
    if not m:
        return None
    dist = getattr(summary, m.group(2))
    return None if dist is None else float(getattr(dist, m.group(1)))


@dataclass(frozen=True)
class ThresholdCheck:
    round: int
    phase: str
    step: int | None
    step_value: float | None
    metric: str
    limit: float
    value: float | None
    passed: bool | None  # None: not measurable in this window


def check_thresholds(metrics: Mapping[str, float], results: Sequence[WindowResult]) -> list[ThresholdCheck]:
    out = []
    for res in results:
        w = res.window
        for name, limit in sorted(metrics.items()):
            value = observed(res.requests, name)
            if value is None:
                passed = None
            elif name.startswith("min_"):
                passed = value >= limit
            else:
                passed = value <= limit
            out.append(
                ThresholdCheck(w.round, w.phase, w.step, w.step_value, name, float(limit), value, passed)
            )
    return out


def highest_passing_value(checks: Sequence[ThresholdCheck]) -> float | None:
    """The observed limit: the last treatment/ramp step value, going up, before the first value at
    which some threshold broke in some round (None when the lowest step already broke)."""
    by_value: dict[float, bool] = {}
    for c in checks:
        if c.phase not in ("treatment", "ramp") or c.step_value is None:
            continue
        by_value[c.step_value] = by_value.get(c.step_value, True) and c.passed is not False
    best = None
    for value in sorted(by_value):
        if not by_value[value]:
            break
        best = value
    return best
