"""Incident figures that must follow the evidence, on hand-built drill timelines:
the trigger is the step that carried load at T0 (never one that sent nothing), onsets are the
first evidence, queueing at a higher step is judged against that step, and a retry storm is
counted from retries only."""

from __future__ import annotations

import pytest

from _narrow import some
from vramlab.analysis.incident import analyse
from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord

RUN = "0badc0de"


def _req(i, sent, end, ok=True, phase="ramp", step=0, attempt=0, client="u0", err="connect", e2e=None):
    return RequestRecord(
        run_id=RUN,
        round=0,
        phase=phase,
        step=step,
        request_id=f"{client}:{i}",
        attempt=attempt,
        sent_s=sent,
        end_s=end,
        e2e_ms=(e2e if e2e is not None else (end - sent) * 1000) if ok else None,
        status_code=200 if ok else 0,
        error_class=None if ok else err,
    )


def _ev(t, kind, **data):
    return EventRecord(run_id=RUN, t_s=t, kind=kind, round=0, message=data.pop("message", kind), data=data)


def _kill_timeline():
    """Baseline 0-4 s, step 0 (conc 2) 4-8 s, step 1 (conc 4) from 8 s; the process is SIGKILLed at
    9.50 s; the ramp's next step (conc 8) starts at 9.56 s and is cut 40 ms later by the detection."""
    reqs = [_req(i, i * 0.2, i * 0.2 + 0.1, phase="baseline", client=f"u{i % 2}") for i in range(20)]
    reqs += [_req(100 + i, 4 + i * 0.1, 4 + i * 0.1 + 0.15, step=0, client=f"u{i % 2}") for i in range(40)]
    reqs += [_req(200 + i, 8 + i * 0.1, 8 + i * 0.1 + 0.2, step=1, client=f"u{i % 4}") for i in range(13)]
    reqs += [
        _req(300 + i, 9.3 + i * 0.05, 9.51, ok=False, step=1, client=f"u{i % 4}", err="stream_broken")
        for i in range(4)
    ]  # in flight at the kill
    # closed-loop users spinning on connection refused: many new requests, no retries (policy none)
    reqs += [
        _req(400 + i, 9.52 + i * 0.01, 9.525 + i * 0.01, ok=False, step=1, client=f"u{i % 4}")
        for i in range(3)
    ]
    reqs += [
        _req(500 + i, 9.7 + i * 0.01, 9.705 + i * 0.01, ok=False, phase="recovery", client=f"u{i % 2}")
        for i in range(200)
    ]
    reqs += [
        _req(800 + i, 14 + i * 0.2, 14 + i * 0.2 + 0.1, phase="recovery", client=f"u{i % 2}")
        for i in range(20)
    ]
    events = [
        _ev(0.0, "phase_start", phase="baseline"),
        _ev(4.0, "step", step=0, value=2),
        _ev(8.0, "step", step=1, value=4),
        _ev(9.56, "step", step=2, value=8),
        _ev(9.55, "process_exit", exit_code=-9),
        _ev(9.60, "detect", condition="process_exit"),
        _ev(
            9.60,
            "fault",
            step=2,
            value=8,
            knob="concurrency",
            unit="concurrent requests",
            step_started_s=9.56,
            t0_s=9.50,
            last_safe_value=4,
            mode="killed_by_signal",
            evidence=['process at 9.55 s: "target process killed by signal 9 (SIGKILL)"'],
        ),
        _ev(10.0, "mitigation", action="restart"),
        _ev(
            16.0,
            "failure_mode",
            mode="killed_by_signal",
            evidence=[
                'process at 9.55 s: "target process killed by signal 9 (SIGKILL)"',
                "no out-of-memory evidence",
            ],
        ),
    ]
    samples = [
        SampleRecord(
            run_id=RUN, t_s=t * 0.25, source="health", name="health.up", value=0.0 if 38 <= t < 56 else 1.0
        )
        for t in range(72)
    ]
    return reqs, samples, events


def test_a_step_that_sent_nothing_is_not_the_trigger_and_t0_is_the_failure():
    reqs, samples, events = _kill_timeline()
    inc = analyse(reqs, samples, events, window_s=1.0)
    assert inc.failure_mode == "killed_by_signal" and "no out-of-memory evidence" in inc.evidence
    assert inc.t0_s == pytest.approx(9.50)
    trig = inc.trigger
    assert trig is not None and trig.step == 1 and trig.value == 4 and trig.in_flight_at_t0 == 4
    assert trig.requests_sent > 0 and trig.confidence == "low"  # a SIGKILL is not tied to load by anything
    assert inc.failure_step == {"step": 1, "value": 4, "knob": "concurrency", "unit": "concurrent requests"}
    assert inc.detected_during is not None and inc.detected_during["step"] == 2
    assert inc.last_safe_value == 2
    assert inc.time_to_detect_s == pytest.approx(0.10)  # from T0, not from the step's start


def test_no_retry_storm_from_closed_loop_users_with_policy_none():
    reqs, samples, events = _kill_timeline()
    s = analyse(reqs, samples, events, window_s=1.0).retry_storm
    assert s.retries == 0 and s.retries_in_window == 0
    assert s.amplification is not None and s.amplification > 2  # the attempt rate did rise ...
    assert s.new_request_ratio is not None and s.new_request_ratio > 2  # ... from new requests
    assert s.attempts_per_request == 1.0 and not s.storm
    # the same wave made of the policy's retries is a storm
    retried = [
        r.model_copy(update={"attempt": 1 + i % 3, "request_id": f"u0:{i // 4}"})
        if r.phase == "recovery" and r.sent_s < 12 and i % 4
        else r
        for i, r in enumerate(reqs)
    ]
    s2 = analyse(retried, samples, events, window_s=1.0).retry_storm
    assert s2.storm and s2.retries_in_window > s2.new_requests and some(s2.attempts_per_request) >= 2


def test_the_retry_waves_peak_is_its_busiest_second_not_the_first_crossing():
    # baseline 5 original requests/s; the recovery window opens at the restart (10.0 s) inside a wave of
    # 100 attempts a second (9.70-11.69 s), then thins to 5/s. The peak is the busiest second's attempts
    # over the baseline's offered rate (20x), wherever it falls, not the rate when a live monitor first
    # crossed 2x, nor the whole window's mean.
    from vramlab.analysis.aftermath import busiest_window

    reqs, samples, events = _kill_timeline()
    s = analyse(reqs, samples, events, window_s=1.0).retry_storm
    base = some(s.baseline_rate_rps)
    assert s.peak_amplification == pytest.approx(100 / base) and s.peak_at_s == pytest.approx(10.0)
    assert some(s.peak_amplification) > some(s.amplification)  # the whole window's mean is lower
    assert busiest_window([0.0, 0.5, 0.99, 1.0, 1.2, 1.9, 5.0], 1.0) == (4, 0.5)  # 0.5-1.2
    assert busiest_window([], 1.0) is None


def test_onset_is_the_first_evidence_not_the_window_edge():
    reqs, samples, events = _kill_timeline()
    inc = analyse(reqs, samples, events, window_s=1.0)
    onsets = {o.name: o.t_s for o in inc.signals.order}
    # the first failed request ended at 9.51 s; its 1 s window starts at 9.0 s
    assert onsets["user.error_rate"] == pytest.approx(9.51)
    assert onsets["service.process_exit"] == pytest.approx(9.55)
    assert onsets["user.error_rate"] < onsets["service.process_exit"]


def test_queueing_at_a_higher_step_is_not_an_anomaly_but_a_rise_within_it_is():
    base = [_req(i, i * 0.1, i * 0.1 + 0.1, phase="baseline") for i in range(40)]  # 100 ms
    steady = [
        _req(100 + i, 4 + i * 0.1, 4 + i * 0.1 + 0.4, step=0) for i in range(60)
    ]  # 400 ms from the start
    events = [
        _ev(0.0, "phase_start", phase="baseline"),
        _ev(4.0, "step", step=0, value=8),
        _ev(10.0, "ceiling", value=8),
    ]
    inc = analyse(base + steady, [], events, window_s=1.0)
    assert "user.e2e_p95_ms" not in [o.name for o in inc.signals.order]
    rising = steady[:40] + [_req(200 + i, 8 + i * 0.1, 8 + i * 0.1 + 2.0, step=0) for i in range(20)]
    inc2 = analyse(base + rising, [], events, window_s=1.0)
    (onset,) = [o for o in inc2.signals.order if o.name == "user.e2e_p95_ms"]
    assert onset.t_s == pytest.approx(10.0)  # the first slow request's end, judged against 400 ms
    assert onset.baseline_mean == pytest.approx(400.0, rel=0.01)


def test_report_names_the_evidence_the_trigger_and_mode_specific_actions():
    from vramlab.report import render
    from vramlab.report.sections import ReportContext

    reqs, samples, events = _kill_timeline()
    run = RunRecord(
        run_id=RUN,
        kind="drill",
        name="kill",
        plan={"clients": {"policy": "none"}},
        plan_hash="0" * 64,
        fixed={},
        target={},
        change={"variable": "concurrency", "unit": "concurrent requests"},
        started_at=0.0,
        status="completed",
    )
    md = render(ReportContext.build(run, reqs, samples, events), "md")
    assert "killed_by_signal" in md and "crash_after_oom" not in md
    assert "killed by signal 9 (SIGKILL)" in md and "No out-of-memory was seen" in md
    assert "confidence **low**" in md and "Detected during ramp step 2" in md
    assert "cap concurrency" not in md and "find what sent the signal (killed by signal 9 (SIGKILL))" in md
    assert "| retry storm | no |" in md and "Not a retry storm" in md
