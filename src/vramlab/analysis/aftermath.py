"""What happened after a drill's failure, from its stored records: the recovery clocks, the impact on
users, the neighbours' share of it (blast radius) and whether recovery drew a retry storm.
`analysis.incident.analyse` puts them into the incident; the boundaries (T0, recovery's three
clocks) are defined there.

Pure: records in, frozen results out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from vramlab.analysis.signals import windowed
from vramlab.records import EventRecord, RequestRecord, SampleRecord
from vramlab.records.events import EventKind
from vramlab.records.stats import percentile


def client_of(request_id: str) -> str:
    """The drill's request ids are 'CLIENT:SEQ'; the client is the 'user' for impact counts."""
    return request_id.split(":", 1)[0]


@dataclass(frozen=True)
class Recovery:
    health_ok_s: float | None  # from T0
    first_success_s: float | None
    p95_ok_s: float | None
    recovered: bool
    time_to_recover_s: float | None
    health_failed: bool


@dataclass(frozen=True)
class Impact:
    requests_during: int  # attempts sent from T0 to recovery
    failed: int  # failed attempts in that window
    in_flight_lost: int  # attempts in flight at T0 (sent by then, still open) that ended in an error
    failed_logical: int  # request ids with no successful attempt at all
    affected_clients: int
    error_classes: dict[str, int]
    baseline_p95_ms: float | None
    incident_p95_ms: float | None
    after_p95_ms: float | None


@dataclass(frozen=True)
class NeighbourImpact:
    name: str
    baseline_error_rate: float | None
    incident_error_rate: float | None
    baseline_p95_ms: float | None
    incident_p95_ms: float | None
    probes_during: int
    affected: bool


@dataclass(frozen=True)
class RetryStorm:
    """Measured, not manufactured: attempts against the baseline's offered rate (original requests
    per second), split into the retry policy's retries and new user requests."""

    baseline_rate_rps: float | None  # offered: original requests (attempt 0) per second in the baseline
    recovery_rate_rps: float | None  # every attempt per second from mitigation (or T0) to recovery
    amplification: float | None  # recovery attempt rate / baseline offered rate
    retries: int  # attempts > 0 from T0 on (the policy's)
    second_oom: bool
    preemptions_during_recovery: float | None
    new_requests: int = 0  # original requests (attempt 0) in the recovery window
    retries_in_window: int = 0  # retries in the recovery window
    attempts_per_request: float | None = None  # attempts / original requests in the recovery window
    new_request_ratio: float | None = None  # new-request rate / baseline offered rate
    storm: bool = False  # the policy's retries at least doubled the attempts and the rate is >= 2x baseline
    # the busiest second of the recovery window: its attempts / the baseline's offered rate, and when
    peak_amplification: float | None = None
    peak_at_s: float | None = None


def since(t: float | None, t0: float | None) -> float | None:
    """A clock (time to detect, alert, mitigate, recover): from T0, never negative."""
    return None if t is None or t0 is None else max(0.0, t - t0)


def p95(reqs: Sequence[RequestRecord]) -> float | None:
    vals = [r.e2e_ms for r in reqs if r.ok and r.e2e_ms is not None]
    return percentile(vals, 95) if vals else None


def series(samples: Sequence[SampleRecord], name: str) -> list[tuple[float, float]]:
    return [(s.t_s, s.value) for s in samples if s.name == name]


def recovery(
    requests: Sequence[RequestRecord],
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
    t0: float | None,
    baseline_start: float,
    tol: float,
    window_s: float,
) -> Recovery:
    if t0 is None:
        return Recovery(None, None, None, False, None, False)
    health = series(samples, "health.up")
    fail_t = next((t for t, v in health if t >= t0 and v < 0.5), None)
    health_ok = next((t for t, v in health if fail_t is not None and t > fail_t and v >= 0.5), None)
    first_err = next(
        (r.end_s or r.sent_s for r in requests if not r.ok and (r.end_s or r.sent_s or 0) >= t0), None
    )
    anchor = first_err if first_err is not None else t0
    first_ok = next((r.end_s for r in requests if r.ok and r.end_s is not None and r.end_s > anchor), None)
    base_reqs = [r for r in requests if r.phase == "baseline"]
    base_p95 = p95(base_reqs)
    p95_ok = None
    if first_ok is not None and base_p95 is not None:
        ok_after = [
            (r.end_s, r.e2e_ms)
            for r in requests
            if r.ok and r.end_s is not None and r.e2e_ms is not None and r.end_s >= first_ok
        ]
        if ok_after:
            end = max(t for t, _ in ok_after) + 1e-9
            for t, p in windowed(ok_after, first_ok, end, window_s, "p95"):
                if p <= base_p95 * (1 + tol):
                    p95_ok = t + window_s if t + window_s <= end else end
                    break
    elif first_ok is not None:
        p95_ok = first_ok  # no baseline latency to compare against: the first success is the bar
    health_failed = fail_t is not None
    clocks = [first_ok, p95_ok] + ([health_ok] if health_failed else [])
    recovered = all(c is not None for c in clocks)
    ttr = since(max(c for c in clocks if c is not None), t0) if recovered else None
    return Recovery(
        since(health_ok, t0), since(first_ok, t0), since(p95_ok, t0), recovered, ttr, health_failed
    )


def impact(
    requests: Sequence[RequestRecord],
    t0: float | None,
    rec_end: float,
    baseline_start: float,
    treatment_start: float | None,
) -> Impact:
    base = [r for r in requests if r.phase == "baseline"]
    if t0 is None:
        during: list[RequestRecord] = []
    else:
        # sent during the incident, or sent before T0 and still in flight at T0
        during = [
            r
            for r in requests
            if ((r.sent_s or 0.0) >= t0 - 1e-9 and (r.sent_s or 0.0) <= rec_end)
            or ((r.sent_s or 0.0) < t0 and (r.end_s or math.inf) >= t0)
        ]
    failed = [r for r in during if not r.ok]
    # in flight at T0 (sent by then, not ended before it) and never answered: the first failed
    # request itself ends at T0, the requests of a hang time out after it
    lost = [
        r
        for r in failed
        if t0 is not None
        and (r.sent_s or 0.0) <= t0 + 1e-9
        and (r.end_s if r.end_s is not None else math.inf) >= t0 - 1e-9
    ]
    touched = {r.request_id for r in during}  # logical requests the incident touched, with all their attempts
    by_id: dict[str, bool] = {}
    for r in requests:
        if r.request_id in touched:
            by_id[r.request_id] = by_id.get(r.request_id, False) or r.ok
    failed_ids = {i for i, ok in by_id.items() if not ok}
    after = [r for r in requests if r.phase == "recovery"]
    return Impact(
        requests_during=len(during),
        failed=len(failed),
        in_flight_lost=len(lost),
        failed_logical=len(failed_ids),
        affected_clients=len({client_of(r.request_id) for r in failed}),
        error_classes=dict(Counter(r.error_class or f"http_{r.status_code}" for r in failed)),
        baseline_p95_ms=p95(base),
        incident_p95_ms=p95(during),
        after_p95_ms=p95(after),
    )


def neighbours(
    samples: Sequence[SampleRecord],
    baseline_start: float,
    treatment_start: float | None,
    t0: float | None,
    rec_end: float,
) -> list[NeighbourImpact]:
    names = sorted(
        {s.name.split(".")[1] for s in samples if s.name.startswith("neighbour.") and s.name.endswith(".ok")}
    )
    out: list[NeighbourImpact] = []
    base_end = treatment_start if treatment_start is not None else (t0 or math.inf)
    for n in names:
        ok = series(samples, f"neighbour.{n}.ok")
        lat = series(samples, f"neighbour.{n}.latency_ms")
        b_ok = [v for t, v in ok if baseline_start <= t < base_end]
        i_ok = [v for t, v in ok if t0 is not None and t0 <= t <= rec_end]
        b_lat = [v for t, v in lat if baseline_start <= t < base_end]
        i_lat = [v for t, v in lat if t0 is not None and t0 <= t <= rec_end]
        b_err = 1 - sum(b_ok) / len(b_ok) if b_ok else None
        i_err = 1 - sum(i_ok) / len(i_ok) if i_ok else None
        b_p95 = percentile(b_lat, 95) if b_lat else None
        i_p95 = percentile(i_lat, 95) if i_lat else None
        affected = bool(
            (i_err is not None and i_err > (b_err or 0.0) + 0.01)
            or (b_p95 is not None and i_p95 is not None and i_p95 > 2 * b_p95 + 5.0)
        )
        out.append(NeighbourImpact(n, b_err, i_err, b_p95, i_p95, len(i_ok), affected))
    return out


def retry_storm(
    requests: Sequence[RequestRecord],
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
    baseline_start: float,
    treatment_start: float | None,
    t0: float | None,
    mitigated: EventRecord | None,
    recovery: Recovery,
    rec_end: float,
) -> RetryStorm:
    base_end = treatment_start if treatment_start is not None else (t0 or math.inf)
    # the offered rate: original requests (attempt 0) the baseline's users sent per second
    base = [
        r
        for r in requests
        if r.sent_s is not None and baseline_start <= r.sent_s < base_end and r.attempt == 0
    ]
    base_dur = (base_end - baseline_start) if base and math.isfinite(base_end) else None
    base_rate = len(base) / base_dur if base_dur else None
    rec_rate = amp = per_req = new_ratio = peak = peak_at = None
    new = retried = 0
    start = mitigated.t_s if mitigated else t0
    if start is not None and rec_end > start:
        # the recovery phase's own traffic: the failing step's load is not a retry wave
        window = [
            r
            for r in requests
            if r.sent_s is not None and start <= r.sent_s <= rec_end and r.phase == "recovery"
        ]
        new = sum(1 for r in window if r.attempt == 0)
        retried = len(window) - new
        rec_rate = len(window) / (rec_end - start)
        amp = rec_rate / base_rate if base_rate else None
        per_req = len(window) / new if new else None
        new_ratio = (new / (rec_end - start)) / base_rate if base_rate else None
        busiest = busiest_window([r.sent_s for r in window if r.sent_s is not None], PEAK_WINDOW_S)
        if busiest is not None and base_rate:
            peak, peak_at = busiest[0] / PEAK_WINDOW_S / base_rate, busiest[1]
    retries = sum(1 for r in requests if r.attempt > 0 and t0 is not None and (r.sent_s or 0.0) >= t0)
    second = False
    if t0 is not None and recovery.time_to_recover_s is not None:
        second = any(e.kind == EventKind.OOM and e.t_s > t0 + recovery.time_to_recover_s for e in events)
    pre = series(samples, "engine.num_preemptions_total")
    pre_rec = None
    if pre and start is not None:
        inside = [v for t, v in pre if start <= t <= rec_end]
        pre_rec = (max(inside) - min(inside)) if inside else None
    storm = bool(amp is not None and amp >= 2.0 and retried > 0 and (per_req is None or per_req >= 2.0))
    return RetryStorm(
        base_rate,
        rec_rate,
        amp,
        retries,
        second,
        pre_rec,
        new,
        retried,
        per_req,
        new_ratio,
        storm,
        peak,
        peak_at,
    )


PEAK_WINDOW_S = 1.0  # the retry wave's peak is read per second, as the live monitor watches it


def busiest_window(times: Sequence[float], width_s: float) -> tuple[int, float] | None:
    """(the most sends inside any window of *width_s*, that window's start), sliding over the sends."""
    ts = sorted(times)
    best: tuple[int, float] | None = None
    lo = 0
    for hi, t in enumerate(ts):
        while t - ts[lo] >= width_s:
            lo += 1
        if best is None or hi - lo + 1 > best[0]:
            best = (hi - lo + 1, ts[lo])
    return best


__all__ = [
    "PEAK_WINDOW_S",
    "Impact",
    "NeighbourImpact",
    "Recovery",
    "RetryStorm",
    "busiest_window",
    "client_of",
    "impact",
    "neighbours",
    "p95",
    "recovery",
    "retry_storm",
    "series",
    "since",
]
