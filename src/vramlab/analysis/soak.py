"""A soak's verdict: its one long treatment window cut into windows of `window_s`, each compared
with the first. Pure.

Per window: requests, error rate, P95 end-to-end and time to first token, and the largest memory
reading (the GPU's used memory, else the target process's resident set). Over the soak: memory
growth per hour (the least-squares slope of the windows' memory over their midpoints), latency
drift (the largest later P95 over the first's, less one), error drift (the largest later error
rate less the first's) and restarts seen (the health check going down and up again, or the target
process exiting). The verdict is "stable" when every figure is within the soak's limits and no
restart was seen, else "drifted" with the reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramlab.analysis.stats import summarize_requests
from vramlab.records import EventRecord, RequestRecord, SampleRecord
from vramlab.records.events import EventKind
from vramlab.units import GIB

MEMORY = ("gpu.memory_used_bytes", "host.target_rss_bytes")  # in this order: the first one sampled


@dataclass(frozen=True)
class SoakWindow:
    start_s: float
    end_s: float
    requests: int
    error_rate: float
    p95_e2e_ms: float | None
    p95_ttft_ms: float | None
    memory_bytes: float | None


@dataclass(frozen=True)
class SoakResult:
    window_s: float
    windows: list[SoakWindow]
    memory_source: str | None
    memory_growth_gib_per_h: float | None
    latency_drift: float | None  # the largest later P95 e2e over the first window's, less one
    error_drift: float
    restarts: int
    verdict: str  # "stable" | "drifted" | "too short"
    reasons: list[str] = field(default_factory=list)


def _slope_per_h(points: Sequence[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mx) * (v - my) for t, v in points) / var * 3600


def _restarts(
    samples: Sequence[SampleRecord], events: Sequence[EventRecord], start: float, end: float
) -> int:
    ups = sorted((s.t_s, s.value) for s in samples if s.name == "health.up" and start <= s.t_s <= end)
    downs = sum(1 for (_, a), (_, b) in zip(ups, ups[1:], strict=False) if a >= 1 and b < 1)
    exits = sum(1 for e in events if e.kind == EventKind.PROCESS_EXIT and start <= e.t_s <= end)
    return max(downs, exits)


def soak_result(
    limits: Mapping[str, Any],
    requests: Sequence[RequestRecord],
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
    span: tuple[float, float],
) -> SoakResult:
    """The soak over *span* (the treatment window's start and end, in run seconds)."""
    window_s = float(limits.get("window_s", 300.0))
    start, end = span
    source = next((m for m in MEMORY if any(s.name == m for s in samples)), None)
    windows = []
    t = start
    while t < end - 1e-9:
        hi = min(t + window_s, end)
        mine = [r for r in requests if r.end_s is not None and t <= r.end_s < hi]
        s = summarize_requests(mine, hi - t)
        mem = [x.value for x in samples if x.name == source and t <= x.t_s < hi]
        windows.append(
            SoakWindow(
                t,
                hi,
                s.count,
                s.error_rate,
                s.e2e.p95 if s.e2e else None,
                s.ttft.p95 if s.ttft else None,
                max(mem) if mem else None,
            )
        )
        t = hi
    mem_points = [
        ((w.start_s + w.end_s) / 2, w.memory_bytes / GIB) for w in windows if w.memory_bytes is not None
    ]
    growth = _slope_per_h(mem_points)
    first = windows[0] if windows else None
    later = windows[1:]
    drift = None
    if first is not None and first.p95_e2e_ms:
        p95s = [w.p95_e2e_ms for w in later if w.p95_e2e_ms is not None]
        drift = max(p95s) / first.p95_e2e_ms - 1 if p95s else None
    err_drift = max((w.error_rate for w in later), default=0.0) - (first.error_rate if first else 0.0)
    restarts = _restarts(samples, events, start, end)
    reasons = []
    if len(windows) < 2:
        return SoakResult(
            window_s,
            windows,
            source,
            growth,
            drift,
            err_drift,
            restarts,
            "too short",
            ["fewer than two windows: nothing to compare with the first"],
        )
    max_growth = float(limits.get("max_memory_growth_gib_per_h", 0.5))
    if growth is not None and growth > max_growth:
        reasons.append(f"memory grew {growth:.2f} GiB/h (limit {max_growth:g})")
    max_lat = float(limits.get("max_latency_drift", 0.25))
    if drift is not None and drift > max_lat:
        reasons.append(f"P95 e2e up {drift:.0%} on the first window's (limit {max_lat:.0%})")
    max_err = float(limits.get("max_error_drift", 0.01))
    if err_drift > max_err:
        reasons.append(f"error rate up {err_drift:.1%} on the first window's (limit {max_err:.1%})")
    if restarts:
        reasons.append(f"{restarts} restart(s) seen")
    return SoakResult(
        window_s,
        windows,
        source,
        growth,
        drift,
        err_drift,
        restarts,
        "drifted" if reasons else "stable",
        reasons,
    )


__all__ = ["SoakResult", "SoakWindow", "soak_result"]
