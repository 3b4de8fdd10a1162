"""The figures of one drill's incident, from its stored records alone.

Boundaries (written into the report, because "MTTR" means six things):
  treatment start  the first ramp step: abnormal signals are only counted from here
  T0               the failure: its first evidence (the first failed request's end, the process
                   exit, the OOM line), as the drill's detector recorded it; older runs without
                   it fall back to the start of the step during which the failure was detected
  trigger          the ramp step that carried load at T0 (a request of it in flight), else the
                   last step that sent a request before T0; a step that sent nothing is never
                   the trigger. With a confidence: high when the mode is load-related (OOM,
                   overload, hang) and the step had requests in flight at T0; medium when not in
                   flight or in the step's first second; low when the mode is a crash or a kill
                   by signal with no evidence tying it to load
  detect           the first detection by the drill (OOM seen, stop condition fired)
  alert            the first alert firing at T0 or after it (Prometheus, or the plan's rules
                   evaluated on the drill's own samples when no Prometheus was configured); an
                   alert that went firing before T0 and was still firing at T0 counts, and its
                   time to alert is negative (the same signed clock as the alert table)
  mitigate         the first corrective action: restart issued, scripted command run, or the
                   operator's first note in manual mode
  recover          three clocks: health 200 again; first successful generation; P95 back within
                   tolerance of the baseline P95. Recovered = all three, time = the latest.

Pure: records in, a frozen result out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vramlab.analysis.signals import (
    Signal,
    SignalReport,
    SignalRule,
    event_signal,
    first_abnormal,
    windowed,
)
from vramlab.records import EventRecord, RequestRecord, SampleRecord
from vramlab.records.stats import percentile

OOM_EVENT_KINDS = ("oom",)


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
    in_flight_lost: int  # attempts in flight at the failure that ended in an error
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


@dataclass(frozen=True)
class Trigger:
    step: int | None
    value: float | None
    requests_sent: int  # by that step before T0
    in_flight_at_t0: int
    confidence: str  # high | medium | low
    reason: str


@dataclass(frozen=True)
class Incident:
    round: int | None
    treatment_start_s: float | None
    t0_s: float | None
    failed: bool
    failure_mode: str  # crash_after_oom | hang | overload_429 | startup_refusal | preemption | oom_no_exit | none
    failure_step: dict[str, Any] | None
    last_safe_value: float | None
    signature: dict[str, Any] | None
    detected_s: float | None
    time_to_detect_s: float | None
    alerts: list[dict[str, Any]]
    time_to_alert_s: float | None
    mitigated_s: float | None
    time_to_mitigate_s: float | None
    recovery: Recovery
    impact: Impact
    signals: SignalReport
    neighbours: list[NeighbourImpact]
    retry_storm: RetryStorm
    notes: list[dict[str, Any]] = field(default_factory=list)
    ceiling: dict[str, Any] | None = None
    trigger: Trigger | None = None
    evidence: list[str] = field(default_factory=list)  # what the failure mode was named from, quoted
    detected_during: dict[str, Any] | None = None  # the step running when the drill detected the failure

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _since(t: float | None, t0: float | None) -> float | None:
    """A clock (time to detect, alert, mitigate, recover): from T0, never negative."""
    return None if t is None or t0 is None else max(0.0, t - t0)


def _signed(t: float | None, t0: float | None) -> float | None:
    """Where an event sits against T0, with its sign (an alert already firing before T0 is negative),
    as the report's timeline and alert table show it."""
    return None if t is None or t0 is None else t - t0


def _first_alert(alerts: Sequence[dict[str, Any]], t0: float | None) -> float | None:
    """When the first alert was firing at T0 or went firing after it. An alert that fired before T0
    counts only while it was still firing at T0 (no later 'inactive' for the same name before T0):
    one that fired and cleared during the baseline says nothing about this incident."""
    if t0 is None:
        return None
    state: dict[Any, tuple[str, float]] = {}
    for a in sorted(alerts, key=lambda a: a["t_s"]):
        if a["t_s"] < t0:
            state[a["name"]] = (a["state"], a["t_s"])
    at_t0 = [t for st, t in state.values() if st == "firing"]
    if at_t0:
        return min(at_t0)
    after = [a["t_s"] for a in alerts if a["state"] == "firing" and a["t_s"] >= t0]
    return min(after) if after else None


def _first(events: Sequence[EventRecord], *kinds: str, after: float = -math.inf, **data: Any) -> EventRecord | None:
    for e in events:
        if e.kind in kinds and e.t_s >= after and all(e.data.get(k) == v for k, v in data.items()):
            return e
    return None


def _p95(reqs: Sequence[RequestRecord]) -> float | None:
    vals = [r.e2e_ms for r in reqs if r.ok and r.e2e_ms is not None]
    return percentile(vals, 95) if vals else None


def _samples(samples: Sequence[SampleRecord], name: str) -> list[tuple[float, float]]:
    return [(s.t_s, s.value) for s in samples if s.name == name]


def analyse(
    requests: Sequence[RequestRecord],
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
    p95_tolerance: float = 0.5,
    window_s: float = 1.0,
    round: int | None = None,
) -> Incident:
    """Analyse one round of a drill (or the whole run when `round` is None)."""
    # requests the drill itself cancelled (end of a window) say nothing about the target
    requests = [r for r in requests if r.error_class != "cancelled"]
    if round is not None:
        requests = [r for r in requests if r.round == round]
        events = [e for e in events if e.round in (round, None)]
    events = sorted(events, key=lambda e: e.t_s)
    requests = sorted(requests, key=lambda r: (r.sent_s if r.sent_s is not None else r.scheduled_s or 0.0))
    samples = sorted(samples, key=lambda s: s.t_s)

    base_ev = _first(events, "phase_start", phase="baseline")
    baseline_start = base_ev.t_s if base_ev else (events[0].t_s if events else 0.0)
    steps = [e for e in events if e.kind == "step"]
    treatment_start = steps[0].t_s if steps else None
    fault = _first(events, "fault")  # written by the drill: the step during which it failed
    failed = fault is not None
    t0: float | None = None
    failure_step = None
    detected_during = None
    last_safe = None
    trigger: Trigger | None = None
    if fault is not None:
        t0 = float(fault.data["t0_s"] if fault.data.get("t0_s") is not None
                   else fault.data.get("step_started_s", fault.t_s))
        detected_during = {k: fault.data.get(k) for k in ("step", "value", "knob", "unit")}
        failure_step = dict(detected_during)
        last_safe = fault.data.get("last_safe_value")
    ceiling_ev = _first(events, "ceiling")
    end_s = max([e.t_s for e in events] + [r.end_s or 0.0 for r in requests] + [0.0])

    detected = _first(events, "detect", "stop_condition", after=t0 or -math.inf) if failed else None
    alerts: list[dict[str, Any]] = [
        {"name": e.data.get("name"), "state": e.data.get("state"), "t_s": float(e.t_s),
         "source": e.data.get("source"), "since_t0_s": _signed(e.t_s, t0)}
        for e in events if e.kind == "alert"
    ]
    first_alert = _first_alert(alerts, t0)
    mitigated = _first(events, "mitigation", after=t0 or -math.inf) if failed else None
    # the drill settles the mode after recovery, when it knows more (exit, refusal on restart)
    settled = next((e for e in reversed(events) if e.kind == "failure_mode"), None) if failed else None
    mode = str((settled or fault).data.get("mode", "unknown")) if fault else "none"
    if fault is not None and t0 is not None:
        trigger = _trigger(requests, steps, t0, mode)
        if trigger.step is not None and trigger.step != detected_during.get("step"):  # type: ignore[union-attr]
            failure_step = {**(failure_step or {}), "step": trigger.step, "value": trigger.value}
            earlier = [e for e in steps if e.data.get("step") is not None and e.data["step"] < trigger.step]
            last_safe = earlier[-1].data.get("value") if earlier else None

    recovery = _recovery(requests, samples, events, t0, baseline_start, p95_tolerance, window_s)
    rec_end = (t0 + recovery.time_to_recover_s) if (t0 is not None and recovery.time_to_recover_s is not None) else end_s
    impact = _impact(requests, t0, rec_end, baseline_start, treatment_start)
    levels = _levels(requests, steps, baseline_start, end_s)
    sig = first_abnormal(
        _signals(requests, samples, events, baseline_start, end_s, window_s, levels),
        t0_s=treatment_start if treatment_start is not None else (t0 or end_s),
        baseline_start_s=baseline_start,
        end_s=rec_end if failed else end_s,
        levels=levels[1:], settle_s=max(1.0, 2 * window_s),
    )
    neighbours = _neighbours(samples, baseline_start, treatment_start, t0, rec_end)
    storm = _storm(requests, samples, events, baseline_start, treatment_start, t0, mitigated, recovery, rec_end)
    notes = [{"t_s": e.t_s, "since_t0_s": _signed(e.t_s, t0), "text": e.message, **e.data}
             for e in events if e.kind == "note"]
    return Incident(
        round=round,
        treatment_start_s=treatment_start,
        t0_s=t0,
        failed=failed,
        failure_mode=mode,
        failure_step=failure_step,
        last_safe_value=last_safe,
        signature=((settled and settled.data.get("signature")) or fault.data.get("signature")) if fault else None,
        detected_s=detected.t_s if detected else None,
        time_to_detect_s=_since(detected.t_s if detected else None, t0),
        alerts=alerts,
        time_to_alert_s=_signed(first_alert, t0),
        mitigated_s=mitigated.t_s if mitigated else None,
        time_to_mitigate_s=_since(mitigated.t_s if mitigated else None, t0),
        recovery=recovery,
        impact=impact,
        signals=sig,
        neighbours=neighbours,
        retry_storm=storm,
        notes=notes,
        ceiling=dict(ceiling_ev.data) if ceiling_ev else None,
        trigger=trigger,
        evidence=list((settled or fault).data.get("evidence") or []) if fault else [],
        detected_during=detected_during,
    )


LOAD_MODES = ("crash_after_oom", "oom_no_exit", "oom_killed", "overload_429", "hang", "preemption")


def _trigger(requests: Sequence[RequestRecord], steps: Sequence[EventRecord], t0: float, mode: str) -> Trigger:
    """The ramp step that carried load at T0 (see the module's boundaries)."""
    starts = [(float(e.t_s), e.data.get("step"), e.data.get("value")) for e in steps]

    def step_at(t: float) -> tuple[int | None, float | None, float]:
        cur: tuple[int | None, float | None, float] = (None, None, -math.inf)
        for st, idx, val in starts:
            if st <= t + 1e-9:
                cur = (idx, val, st)
        return cur

    ramp = [r for r in requests if r.phase == "ramp" and r.sent_s is not None and r.sent_s <= t0 + 1e-9]
    in_flight = [r for r in ramp if (r.end_s if r.end_s is not None else math.inf) >= t0 - 1e-9]
    load_related = mode.split("+")[0] in LOAD_MODES
    if in_flight:
        idx, val, st = max((step_at(r.sent_s or 0.0) for r in in_flight), key=lambda x: x[2])
        n_flight = sum(1 for r in in_flight if step_at(r.sent_s or 0.0)[0] == idx)
        sent = sum(1 for r in ramp if step_at(r.sent_s or 0.0)[0] == idx)
        early = t0 - st < 1.0
        if not load_related:
            what = {"killed_by_signal": "a kill by signal", "crash": "a crash"}.get(mode.split("+")[0],
                                                                                  mode.split("+")[0])
            conf, why = "low", f"{what}, and no evidence that load caused it: the step only carried load when it happened"
        elif early:
            conf, why = "medium", f"T0 came {t0 - st:.2f} s into the step: the step before may have set it up"
        else:
            conf, why = "high", f"{n_flight} of its requests were in flight at T0"
        return Trigger(idx, val, sent, n_flight, conf, why)
    if ramp:
        last = max(ramp, key=lambda r: r.sent_s or 0.0)
        idx, val, _ = step_at(last.sent_s or 0.0)
        sent = sum(1 for r in ramp if step_at(r.sent_s or 0.0)[0] == idx)
        return Trigger(idx, val, sent, 0, "low" if not load_related else "medium",
                       "no request was in flight at T0; this was the last step that sent one before it")
    return Trigger(None, None, 0, 0, "low", "no ramp step had sent a request before T0")


def _recovery(requests, samples, events, t0, baseline_start, tol, window_s) -> Recovery:
    if t0 is None:
        return Recovery(None, None, None, False, None, False)
    health = _samples(samples, "health.up")
    fail_t = next((t for t, v in health if t >= t0 and v < 0.5), None)
    health_ok = next((t for t, v in health if fail_t is not None and t > fail_t and v >= 0.5), None)
    first_err = next((r.end_s or r.sent_s for r in requests if not r.ok and (r.end_s or r.sent_s or 0) >= t0), None)
    anchor = first_err if first_err is not None else t0
    first_ok = next((r.end_s for r in requests if r.ok and r.end_s is not None and r.end_s > anchor), None)
    base_reqs = [r for r in requests if r.phase == "baseline"]
    base_p95 = _p95(base_reqs)
    p95_ok = None
    if first_ok is not None and base_p95 is not None:
        ok_after = [(r.end_s, r.e2e_ms) for r in requests
                    if r.ok and r.end_s is not None and r.e2e_ms is not None and r.end_s >= first_ok]
        if ok_after:
            end = max(t for t, _ in ok_after) + 1e-9
            for t, p in windowed(ok_after, first_ok, end, window_s, "p95"):  # type: ignore[arg-type]
                if p <= base_p95 * (1 + tol):
                    p95_ok = t + window_s if t + window_s <= end else end
                    break
    elif first_ok is not None:
        p95_ok = first_ok  # no baseline latency to compare against: the first success is the bar
    health_failed = fail_t is not None
    clocks = [first_ok, p95_ok] + ([health_ok] if health_failed else [])
    recovered = all(c is not None for c in clocks)
    ttr = _since(max(c for c in clocks if c is not None), t0) if recovered else None
    return Recovery(_since(health_ok, t0), _since(first_ok, t0), _since(p95_ok, t0), recovered, ttr, health_failed)


def _impact(requests, t0, rec_end, baseline_start, treatment_start) -> Impact:
    base = [r for r in requests if r.phase == "baseline"]
    if t0 is None:
        during: list[RequestRecord] = []
    else:
        # sent during the incident, or sent before T0 and still in flight at T0
        during = [r for r in requests if ((r.sent_s or 0.0) >= t0 - 1e-9 and (r.sent_s or 0.0) <= rec_end)
                  or ((r.sent_s or 0.0) < t0 and (r.end_s or math.inf) >= t0)]
    failed = [r for r in during if not r.ok]
    fail_t = min((r.end_s or math.inf for r in failed), default=None)
    lost = [r for r in failed if fail_t is not None and (r.sent_s or 0.0) <= fail_t and (r.end_s or math.inf) >= fail_t]
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
        baseline_p95_ms=_p95(base),
        incident_p95_ms=_p95(during),
        after_p95_ms=_p95(after),
    )


def _levels(requests, steps, baseline_start, end) -> list[tuple[float, float]]:
    """Load levels in time: the baseline, each ramp step, then recovery (from its first request)."""
    cuts = [baseline_start] + [float(e.t_s) for e in steps]
    rec = min((r.sent_s for r in requests if r.phase == "recovery" and r.sent_s is not None), default=None)
    if rec is not None and rec > cuts[-1]:
        cuts.append(rec)
    ends = cuts[1:] + [max(end, cuts[-1]) + 1e-6]
    return [(a, b) for a, b in zip(cuts, ends, strict=True) if b > a]


def _by_level(points, levels, window_s, how) -> tuple[tuple[float, float], ...]:
    """Windows that never straddle two load levels: each level's windows start at its own start."""
    out: list[tuple[float, float]] = []
    for a, b in levels:
        out += windowed(points, a, b, window_s, how)
    return tuple(out)


def _signals(requests, samples, events, start, end, window_s, levels=None) -> list[Signal]:
    out: list[Signal] = []
    levels = levels or [(start, end + window_s)]
    ends = [(r.end_s, 0.0 if r.ok else 1.0) for r in requests if r.end_s is not None]
    err_rate = _by_level(ends, levels, window_s, "mean")  # share failed per window
    out.append(Signal("user.error_rate", "user", err_rate, SignalRule(threshold=0.05, deviation=False),
                      raw=tuple(ends), window_s=window_s))
    lat = [(r.end_s, r.e2e_ms) for r in requests if r.ok and r.end_s is not None and r.e2e_ms is not None]
    out.append(Signal("user.e2e_p95_ms", "user", _by_level(lat, levels, window_s, "p95"),
                      SignalRule(rel=1.0, k_sigma=4.0), "ms", raw=tuple(lat), window_s=window_s))
    out.append(Signal("service.health_ok", "service", tuple(_samples(samples, "health.up")),
                      SignalRule(direction="down", threshold=0.5, deviation=False)))
    for name, rule in (
        ("engine.kv_cache_usage_perc", SignalRule(threshold=0.9, rel=0.5, min_delta=0.2)),
        ("engine.num_requests_waiting", SignalRule(rel=1.0, min_delta=2.0, consecutive=2)),
        ("engine.num_preemptions_total", SignalRule(min_delta=0.5, per_level=False)),
    ):
        pts = _samples(samples, name)
        if pts:
            out.append(Signal(name, "service", tuple(pts), rule))
    used = _samples(samples, "gpu.memory_used_bytes")
    total = dict(_samples(samples, "gpu.memory_total_bytes"))
    if used and total:
        cap = max(total.values())
        share = tuple((t, v / cap) for t, v in used if cap > 0)
        out.append(Signal("resource.gpu_memory_share", "resource", share, SignalRule(threshold=0.98, min_delta=0.02)))
    for kind, layer, name in (("oom", "service", "service.oom_log"), ("process_exit", "service", "service.process_exit"),
                              ("xid", "resource", "resource.xid")):
        times = [e.t_s for e in events if e.kind == kind]
        if times:
            out.append(event_signal(name, layer, times))  # type: ignore[arg-type]
    return out


def _neighbours(samples, baseline_start, treatment_start, t0, rec_end) -> list[NeighbourImpact]:
    names = sorted({s.name.split(".")[1] for s in samples if s.name.startswith("neighbour.") and s.name.endswith(".ok")})
    out: list[NeighbourImpact] = []
    base_end = treatment_start if treatment_start is not None else (t0 or math.inf)
    for n in names:
        ok = _samples(samples, f"neighbour.{n}.ok")
        lat = _samples(samples, f"neighbour.{n}.latency_ms")
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


def _storm(requests, samples, events, baseline_start, treatment_start, t0, mitigated, recovery, rec_end) -> RetryStorm:
    base_end = treatment_start if treatment_start is not None else (t0 or math.inf)
    # the offered rate: original requests (attempt 0) the baseline's users sent per second
    base = [r for r in requests if r.sent_s is not None and baseline_start <= r.sent_s < base_end and r.attempt == 0]
    base_dur = (base_end - baseline_start) if base and math.isfinite(base_end) else None
    base_rate = len(base) / base_dur if base_dur else None
    rec_rate = amp = per_req = new_ratio = None
    new = retried = 0
    start = mitigated.t_s if mitigated else t0
    if start is not None and rec_end > start:
        # the recovery phase's own traffic: the failing step's load is not a retry wave
        window = [r for r in requests if r.sent_s is not None and start <= r.sent_s <= rec_end and r.phase == "recovery"]
        new = sum(1 for r in window if r.attempt == 0)
        retried = len(window) - new
        rec_rate = len(window) / (rec_end - start)
        amp = rec_rate / base_rate if base_rate else None
        per_req = len(window) / new if new else None
        new_ratio = (new / (rec_end - start)) / base_rate if base_rate else None
    retries = sum(1 for r in requests if r.attempt > 0 and t0 is not None and (r.sent_s or 0.0) >= t0)
    second = False
    if t0 is not None and recovery.time_to_recover_s is not None:
        second = any(e.kind == "oom" and e.t_s > t0 + recovery.time_to_recover_s for e in events)
    pre = _samples(samples, "engine.num_preemptions_total")
    pre_rec = None
    if pre and start is not None:
        inside = [v for t, v in pre if start <= t <= rec_end]
        pre_rec = (max(inside) - min(inside)) if inside else None
    storm = bool(amp is not None and amp >= 2.0 and retried > 0 and (per_req is None or per_req >= 2.0))
    return RetryStorm(base_rate, rec_rate, amp, retries, second, pre_rec, new, retried, per_req, new_ratio, storm)


__all__ = ["Impact", "Incident", "NeighbourImpact", "Recovery", "RetryStorm", "Trigger", "analyse", "client_of"]
