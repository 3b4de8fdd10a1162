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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vramlab.analysis import aftermath
from vramlab.analysis.aftermath import Impact, NeighbourImpact, Recovery, RetryStorm, series, since
from vramlab.analysis.signals import (
    Signal,
    SignalReport,
    SignalRule,
    event_signal,
    first_abnormal,
    windowed,
)
from vramlab.records import EventRecord, RequestRecord, SampleRecord
from vramlab.records.events import (
    EventKind,
    alert_data,
    ceiling_data,
    failure_mode_data,
    fault_data,
    note_data,
    phase_start_data,
    step_data,
)

K = EventKind
OOM_EVENT_KINDS = (K.OOM,)


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
    failure_mode: (
        str  # crash_after_oom | hang | overload_429 | startup_refusal | preemption | oom_no_exit | none
    )
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


def _first(events: Sequence[EventRecord], *kinds: EventKind, after: float = -math.inf) -> EventRecord | None:
    return next((e for e in events if e.kind in kinds and e.t_s >= after), None)


def _fault_figures(fault: EventRecord) -> tuple[float, dict[str, Any], Any]:
    """(T0, the step the failure was detected during, the last safe value) from the drill's fault event."""
    d = fault_data(fault)
    t0 = d.get("t0_s")
    t0 = float(t0 if t0 is not None else d.get("step_started_s", fault.t_s))
    return (
        t0,
        {"step": d.get("step"), "value": d.get("value"), "knob": d.get("knob"), "unit": d.get("unit")},
        d.get("last_safe_value"),
    )


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
    requests = sorted(requests, key=lambda r: r.sent_s if r.sent_s is not None else r.scheduled_s or 0.0)
    samples = sorted(samples, key=lambda s: s.t_s)

    base_ev = next(
        (e for e in events if e.kind == K.PHASE_START and phase_start_data(e).get("phase") == "baseline"),
        None,
    )
    baseline_start = base_ev.t_s if base_ev else (events[0].t_s if events else 0.0)
    steps = [e for e in events if e.kind == K.STEP]
    treatment_start = steps[0].t_s if steps else None
    fault = _first(events, K.FAULT)  # written by the drill: the step during which it failed
    failed = fault is not None
    t0: float | None = None
    failure_step = None
    detected_during = None
    last_safe = None
    trigger: Trigger | None = None
    if fault is not None:
        t0, detected_during, last_safe = _fault_figures(fault)
        failure_step = dict(detected_during)
    ceiling_ev = _first(events, K.CEILING)
    end_s = max([e.t_s for e in events] + [r.end_s or 0.0 for r in requests] + [0.0])

    detected = _first(events, K.DETECT, K.STOP_CONDITION, after=t0 or -math.inf) if failed else None
    alerts: list[dict[str, Any]] = [
        {
            "name": d.get("name"),
            "state": d.get("state"),
            "t_s": float(e.t_s),
            "source": d.get("source"),
            "since_t0_s": _signed(e.t_s, t0),
        }
        for e in events
        if e.kind == K.ALERT
        for d in (alert_data(e),)
    ]
    first_alert = _first_alert(alerts, t0)
    mitigated = _first(events, K.MITIGATION, after=t0 or -math.inf) if failed else None
    # the drill settles the mode after recovery, when it knows more (exit, refusal on restart)
    settled_ev = next((e for e in reversed(events) if e.kind == K.FAILURE_MODE), None) if failed else None
    settled = failure_mode_data(settled_ev) if settled_ev else None
    verdict = (settled if settled is not None else fault_data(fault)) if fault else None
    mode = str(verdict.get("mode", "unknown")) if verdict is not None else "none"
    if fault is not None and t0 is not None:
        trigger = _trigger(requests, steps, t0, mode)
        if trigger.step is not None and trigger.step != detected_during.get("step"):  # type: ignore[union-attr]
            failure_step = {**(failure_step or {}), "step": trigger.step, "value": trigger.value}
            earlier = [
                d for d in map(step_data, steps) if (i := d.get("step")) is not None and i < trigger.step
            ]
            last_safe = earlier[-1].get("value") if earlier else None

    recovery = aftermath.recovery(requests, samples, events, t0, baseline_start, p95_tolerance, window_s)
    rec_end = (
        (t0 + recovery.time_to_recover_s)
        if (t0 is not None and recovery.time_to_recover_s is not None)
        else end_s
    )
    impact = aftermath.impact(requests, t0, rec_end, baseline_start, treatment_start)
    levels = _levels(requests, steps, baseline_start, end_s)
    sig = first_abnormal(
        _signals(requests, samples, events, baseline_start, end_s, window_s, levels),
        t0_s=treatment_start if treatment_start is not None else (t0 or end_s),
        baseline_start_s=baseline_start,
        end_s=rec_end if failed else end_s,
        levels=levels[1:],
        settle_s=max(1.0, 2 * window_s),
    )
    neighbours = aftermath.neighbours(samples, baseline_start, treatment_start, t0, rec_end)
    storm = aftermath.retry_storm(
        requests, samples, events, baseline_start, treatment_start, t0, mitigated, recovery, rec_end
    )
    notes = [
        {"t_s": e.t_s, "since_t0_s": _signed(e.t_s, t0), "text": e.message, **note_data(e)}
        for e in events
        if e.kind == K.NOTE
    ]
    return Incident(
        round=round,
        treatment_start_s=treatment_start,
        t0_s=t0,
        failed=failed,
        failure_mode=mode,
        failure_step=failure_step,
        last_safe_value=last_safe,
        signature=((settled and settled.get("signature")) or fault_data(fault).get("signature"))
        if fault
        else None,
        detected_s=detected.t_s if detected else None,
        time_to_detect_s=since(detected.t_s if detected else None, t0),
        alerts=alerts,
        time_to_alert_s=_signed(first_alert, t0),
        mitigated_s=mitigated.t_s if mitigated else None,
        time_to_mitigate_s=since(mitigated.t_s if mitigated else None, t0),
        recovery=recovery,
        impact=impact,
        signals=sig,
        neighbours=neighbours,
        retry_storm=storm,
        notes=notes,
        ceiling=dict(ceiling_data(ceiling_ev)) if ceiling_ev else None,
        trigger=trigger,
        evidence=list(verdict.get("evidence") or []) if verdict is not None else [],
        detected_during=detected_during,
    )


LOAD_MODES = ("crash_after_oom", "oom_no_exit", "oom_killed", "overload_429", "hang", "preemption")


def _trigger(
    requests: Sequence[RequestRecord], steps: Sequence[EventRecord], t0: float, mode: str
) -> Trigger:
    """The ramp step that carried load at T0 (see the module's boundaries)."""
    starts = [(float(e.t_s), d.get("step"), d.get("value")) for e in steps for d in (step_data(e),)]

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
            what = {"killed_by_signal": "a kill by signal", "crash": "a crash"}.get(
                mode.split("+")[0], mode.split("+")[0]
            )
            conf, why = (
                "low",
                f"{what}, and no evidence that load caused it: the step only carried load when it happened",
            )
        elif early:
            conf, why = "medium", f"T0 came {t0 - st:.2f} s into the step: the step before may have set it up"
        else:
            conf, why = "high", f"{n_flight} of its requests were in flight at T0"
        return Trigger(idx, val, sent, n_flight, conf, why)
    if ramp:
        last = max(ramp, key=lambda r: r.sent_s or 0.0)
        idx, val, _ = step_at(last.sent_s or 0.0)
        sent = sum(1 for r in ramp if step_at(r.sent_s or 0.0)[0] == idx)
        return Trigger(
            idx,
            val,
            sent,
            0,
            "low" if not load_related else "medium",
            "no request was in flight at T0; this was the last step that sent one before it",
        )
    return Trigger(None, None, 0, 0, "low", "no ramp step had sent a request before T0")


def _levels(
    requests: Sequence[RequestRecord], steps: Sequence[EventRecord], baseline_start: float, end: float
) -> list[tuple[float, float]]:
    """Load levels in time: the baseline, each ramp step, then recovery (from its first request)."""
    cuts = [baseline_start] + [float(e.t_s) for e in steps]
    rec = min((r.sent_s for r in requests if r.phase == "recovery" and r.sent_s is not None), default=None)
    if rec is not None and rec > cuts[-1]:
        cuts.append(rec)
    ends = cuts[1:] + [max(end, cuts[-1]) + 1e-6]
    return [(a, b) for a, b in zip(cuts, ends, strict=True) if b > a]


def _by_level(
    points: Sequence[tuple[float, float]], levels: Sequence[tuple[float, float]], window_s: float, how: str
) -> tuple[tuple[float, float], ...]:
    """Windows that never straddle two load levels: each level's windows start at its own start."""
    out: list[tuple[float, float]] = []
    for a, b in levels:
        out += windowed(points, a, b, window_s, how)
    return tuple(out)


def _signals(
    requests: Sequence[RequestRecord],
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
    start: float,
    end: float,
    window_s: float,
    levels: list[tuple[float, float]] | None = None,
) -> list[Signal]:
    out: list[Signal] = []
    levels = levels or [(start, end + window_s)]
    ends = [(r.end_s, 0.0 if r.ok else 1.0) for r in requests if r.end_s is not None]
    err_rate = _by_level(ends, levels, window_s, "mean")  # share failed per window
    out.append(
        Signal(
            "user.error_rate",
            "user",
            err_rate,
            SignalRule(threshold=0.05, deviation=False),
            raw=tuple(ends),
            window_s=window_s,
        )
    )
    lat = [(r.end_s, r.e2e_ms) for r in requests if r.ok and r.end_s is not None and r.e2e_ms is not None]
    out.append(
        Signal(
            "user.e2e_p95_ms",
            "user",
            _by_level(lat, levels, window_s, "p95"),
            SignalRule(rel=1.0, k_sigma=4.0),
            "ms",
            raw=tuple(lat),
            window_s=window_s,
        )
    )
    out.append(
        Signal(
            "service.health_ok",
            "service",
            tuple(series(samples, "health.up")),
            SignalRule(direction="down", threshold=0.5, deviation=False),
        )
    )
    for name, rule in (
        ("engine.kv_cache_usage_perc", SignalRule(threshold=0.9, rel=0.5, min_delta=0.2)),
        ("engine.num_requests_waiting", SignalRule(rel=1.0, min_delta=2.0, consecutive=2)),
        ("engine.num_preemptions_total", SignalRule(min_delta=0.5, per_level=False)),
    ):
        pts = series(samples, name)
        if pts:
            out.append(Signal(name, "service", tuple(pts), rule))
    used = series(samples, "gpu.memory_used_bytes")
    total = dict(series(samples, "gpu.memory_total_bytes"))
    if used and total:
        cap = max(total.values())
        share = tuple((t, v / cap) for t, v in used if cap > 0)
        out.append(
            Signal("resource.gpu_memory_share", "resource", share, SignalRule(threshold=0.98, min_delta=0.02))
        )
    for kind, layer, name in (
        (K.OOM, "service", "service.oom_log"),
        (K.PROCESS_EXIT, "service", "service.process_exit"),
        (K.XID, "resource", "resource.xid"),
    ):
        times = [e.t_s for e in events if e.kind == kind]
        if times:
            out.append(event_signal(name, layer, times))  # type: ignore[arg-type]
    return out


__all__ = ["Incident", "Trigger", "analyse"]
