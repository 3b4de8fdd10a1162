"""First abnormal signal and incident figures on synthetic timelines with known answers."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from _narrow import some, stand_in
from vramlab.analysis.incident import analyse
from vramlab.analysis.signals import (
    Signal,
    SignalRule,
    event_signal,
    first_abnormal,
    onset_of,
    windowed,
)
from vramlab.records import EventRecord, RequestRecord, SampleRecord
from vramlab.records.stats import percentile
from vramlab.report.blocks import Text

RUN = "0123abcd"


def test_threshold_and_deviation_onsets_and_order():
    flat = [(t * 0.5, 0.3) for t in range(20)]  # baseline 0..10 s at 0.3
    kv = Signal(
        "kv",
        "service",
        tuple(flat + [(10.0, 0.5), (11.0, 0.95), (12.0, 0.97)]),
        SignalRule(threshold=0.9, deviation=False),
    )
    lat = Signal(
        "p95",
        "user",
        tuple([(t * 0.5, 100.0 + (t % 2)) for t in range(20)] + [(10.5, 400.0), (11.5, 500.0)]),
        SignalRule(rel=1.0),
    )
    mem = Signal("mem", "resource", tuple(flat + [(12.5, 0.31)]), SignalRule(min_delta=0.1))
    rep = first_abnormal([kv, lat, mem], t0_s=10.0, baseline_start_s=0.0)
    assert rep.first is not None
    assert (rep.first.name, rep.first.t_s, rep.first.reason) == ("p95", 10.5, "deviation")
    assert [o.name for o in rep.order] == ["p95", "kv"]
    assert rep.order[1].t_s == 11.0 and rep.order[1].reason == "threshold"
    assert rep.quiet == ("mem",)
    assert rep.first_by_layer["resource"] is None


def test_consecutive_ignores_single_blip_and_onset_is_first_of_run():
    pts = [(t, 1.0) for t in range(10)] + [(10, 9.0), (11, 1.0), (12, 9.0), (13, 9.0), (14, 9.0)]
    sig = Signal("q", "service", tuple(pts), SignalRule(threshold=5, deviation=False, consecutive=3))
    o = onset_of(sig, 10.0, 0.0)
    assert o is not None and o.t_s == 12


def test_baseline_noise_flagged_and_tie_goes_to_user_layer():
    a = Signal("res", "resource", ((1.0, 9.0), (5.0, 9.0)), SignalRule(threshold=5, deviation=False))
    b = Signal("usr", "user", ((5.0, 9.0),), SignalRule(threshold=5, deviation=False))
    rep = first_abnormal([a, b], t0_s=4.0, baseline_start_s=0.0)
    assert rep.noisy == ("res",)
    assert rep.first is not None and rep.first.name == "usr"


def test_down_direction_and_events():
    health = Signal(
        "h", "service", ((0, 1), (1, 1), (2, 0)), SignalRule(direction="down", threshold=0.5, deviation=False)
    )
    ev = event_signal("exit", "service", [2.5])
    rep = first_abnormal([health, ev], t0_s=1.5, baseline_start_s=0)
    assert [(o.name, o.t_s) for o in rep.order] == [("h", 2), ("exit", 2.5)]


def test_windowed_and_percentile():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 95) == 5
    w = windowed([(0.1, 1), (0.2, 3), (1.5, 10)], 0, 3, 1, "mean")
    assert w == ((0, 2.0), (1, 10.0))
    assert windowed([(0.1, 1), (1.5, 1)], 0, 2, 1, "rate") == ((0, 1.0), (1, 1.0))


@settings(max_examples=200, deadline=None)
@given(
    pts=st.lists(st.tuples(st.floats(0, 100), st.floats(-1e6, 1e6)), max_size=40),
    t0=st.floats(0, 100),
    thr=st.one_of(st.none(), st.floats(-1e6, 1e6)),
    direction=st.sampled_from(["up", "down"]),
)
def test_property_first_abnormal_never_before_treatment(pts, t0, thr, direction):
    sig = Signal("s", "user", tuple(pts), SignalRule(direction=direction, threshold=thr))
    rep = first_abnormal([sig], t0_s=t0, baseline_start_s=0.0)
    for o in rep.order:
        assert o.t_s >= t0
    if rep.first:
        assert rep.first.t_s == min(o.t_s for o in rep.order)


# ---- incident figures on a hand-built drill timeline ------------------------------------------


def _req(i, sent, end, ok=True, phase="ramp", attempt=0, e2e=None, client="c0", err="http_5xx"):
    return RequestRecord(
        run_id=RUN,
        round=0,
        phase=phase,
        request_id=f"{client}:{i}",
        attempt=attempt,
        sent_s=sent,
        end_s=end,
        e2e_ms=(e2e if e2e is not None else (end - sent) * 1000) if ok else None,
        status_code=200 if ok else 500,
        error_class=None if ok else err,
    )


def _ev(t, kind, **data):
    return EventRecord(run_id=RUN, t_s=t, kind=kind, round=0, message=data.pop("message", kind), data=data)


def _timeline():
    reqs = []
    # baseline 0-4 s: 4 req/s, 100 ms
    reqs += [_req(i, i * 0.25, i * 0.25 + 0.1, phase="baseline", client=f"c{i % 2}") for i in range(16)]
    # steps 4-10 s: ok and 200 ms
    reqs += [_req(100 + i, 4 + i * 0.25, 4 + i * 0.25 + 0.2, client=f"c{i % 2}") for i in range(24)]
    # fault step from 10 s: two in flight die at 10.4 (one of them in flight at T0), then failures until 13.1
    reqs += [_req(200, 10.0, 10.4, ok=False, client="c0"), _req(201, 10.1, 10.4, ok=False, client="c1")]
    reqs += [_req(200, 10.6, 10.7, ok=False, attempt=1, client="c0", err="connect")]
    reqs += [
        _req(202 + i, 11 + i * 0.2, 11 + i * 0.2 + 0.01, ok=False, client="c2", err="connect")
        for i in range(10)
    ]
    # retry of 201 at 13.0 succeeds at 13.1; then a surge of retries and normal latency
    reqs += [_req(201, 13.0, 13.1, attempt=2, client="c1", e2e=100)]
    reqs += [
        _req(300 + i, 13.1 + i * 0.05, 13.2 + i * 0.05, phase="recovery", client="c0") for i in range(40)
    ]
    samples = [
        SampleRecord(
            run_id=RUN, t_s=t * 0.5, source="health", name="health.up", value=0.0 if 21 <= t < 26 else 1.0
        )
        for t in range(40)
    ]
    samples += [
        SampleRecord(run_id=RUN, t_s=t * 0.5, source="health", name="neighbour.emb.ok", value=1.0)
        for t in range(40)
    ]
    samples += [
        SampleRecord(
            run_id=RUN,
            t_s=t * 0.5,
            source="health",
            name="neighbour.emb.latency_ms",
            value=50.0 if 20 <= t < 26 else 5.0,
        )
        for t in range(40)
    ]
    events = [
        _ev(0.0, "phase_start", phase="baseline"),
        _ev(4.0, "step", step=0, value=1024),
        _ev(7.0, "step", step=1, value=2048),
        _ev(10.0, "step", step=2, value=4096),
        _ev(10.3, "oom", signature={"class": "runtime_oom"}),
        _ev(10.4, "process_exit", exit_code=1),
        _ev(10.5, "detect", condition="oom"),
        _ev(
            10.5,
            "fault",
            step=2,
            value=4096,
            knob="context",
            unit="prompt tokens",
            step_started_s=10.0,
            last_safe_value=2048,
            mode="crash_after_oom",
            signature={"class": "runtime_oom", "line": "CUDA out of memory"},
        ),
        _ev(11.0, "alert", name="ErrRate", state="pending", source="evaluated"),
        _ev(12.0, "alert", name="ErrRate", state="firing", source="evaluated"),
        _ev(11.2, "mitigation", action="restart"),
        _ev(12.2, "note", message="watched it restart"),
    ]
    return reqs, samples, events


def test_incident_figures_known_answers():
    reqs, samples, events = _timeline()
    inc = analyse(reqs, samples, events, p95_tolerance=0.5, window_s=1.0)
    assert inc.failed and inc.failure_mode == "crash_after_oom"
    assert inc.t0_s == 10.0 and inc.last_safe_value == 2048
    assert math.isclose(some(inc.time_to_detect_s), 0.5)
    assert math.isclose(some(inc.time_to_alert_s), 2.0)
    assert math.isclose(some(inc.time_to_mitigate_s), 1.2)
    r = inc.recovery
    assert r.health_failed and math.isclose(some(r.health_ok_s), 3.0)  # health 0 from 10.5, 1 again at 13.0
    assert math.isclose(some(r.first_success_s), 3.1)
    assert r.recovered and some(r.time_to_recover_s) >= 3.1
    imp = inc.impact
    # in flight at T0 (10.0, the step start: the fault event carries no t0_s): request 200 only; 201 was sent
    # at 10.1, after T0, so it is a failure during the incident but not a request the fault caught in flight
    assert imp.failed == 13 and imp.in_flight_lost == 1
    assert imp.affected_clients == 3
    assert imp.error_classes == {"http_5xx": 2, "connect": 11}
    assert imp.failed_logical == 11  # 201 succeeded on its retry
    assert math.isclose(some(imp.baseline_p95_ms), 100.0)
    # the first abnormal signal is never before the ramp, and the ordering follows the timeline
    assert inc.signals.first is not None and inc.signals.first.t_s >= 4.0
    names = [o.name for o in inc.signals.order]
    assert names.index("service.oom_log") < names.index("service.process_exit")
    assert inc.retry_storm.retries == 2
    assert inc.retry_storm.amplification is not None and inc.retry_storm.amplification > 1
    (nb,) = inc.neighbours
    assert nb.name == "emb" and nb.affected and nb.incident_error_rate == 0.0
    assert [n["text"] for n in inc.notes] == ["watched it restart"]


def test_no_failure_within_ceiling():
    reqs, samples, _ = _timeline()
    events = [
        _ev(0.0, "phase_start", phase="baseline"),
        _ev(4.0, "step", step=0, value=1024),
        _ev(9.0, "ceiling", value=32768, unit="prompt tokens"),
    ]
    inc = analyse([r for r in reqs if r.ok], samples, events)
    assert not inc.failed and inc.failure_mode == "none" and inc.t0_s is None
    assert inc.recovery.time_to_recover_s is None and inc.ceiling == {"value": 32768, "unit": "prompt tokens"}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 20), st.floats(0, 3), st.booleans()), min_size=1, max_size=30),
    st.floats(0, 20),
)
def test_property_recovery_times_non_negative(raw, t0):
    reqs = [
        _req(i, s, s + d, ok=ok, phase="baseline" if s < 2 else "ramp") for i, (s, d, ok) in enumerate(raw)
    ]
    events = [
        _ev(0.0, "phase_start", phase="baseline"),
        _ev(min(2.0, t0), "step", step=0, value=1),
        _ev(t0, "fault", step=0, value=1, step_started_s=t0),
    ]
    inc = analyse(reqs, [], events)
    rec = inc.recovery
    for v in (rec.health_ok_s, rec.first_success_s, rec.p95_ok_s, rec.time_to_recover_s):
        assert v is None or v >= 0
    if rec.recovered:
        assert some(rec.time_to_recover_s) >= max(
            x for x in (rec.first_success_s, rec.p95_ok_s) if x is not None
        )


def test_not_recovered_summary_names_the_clock_that_never_came_back():
    from vramlab.analysis.aftermath import Recovery
    from vramlab.report.incident_text import _not_recovered

    assert "no successful request" in _not_recovered(Recovery(None, None, None, False, None, True))
    assert "health still failing" in _not_recovered(Recovery(None, 2.0, None, False, None, True))
    latency = _not_recovered(Recovery(1.5, 2.0, None, False, None, True))
    assert latency.startswith("serving again after 2") and "P95" in latency


def test_lessons_and_recovery_verdict_say_what_the_headline_says_when_p95_never_came_back(monkeypatch):
    """A full demo on an idle box printed "serving again after 1.26 s, but P95 latency not back ... NOT
    recovered" in the headline and "The target did not serve again within the recovery limit" in the
    lessons. Both now name the same clock."""
    import dataclasses

    import vramlab.report.incident as rep
    from vramlab.analysis.aftermath import Recovery
    from vramlab.report.incident_text import _not_recovered, lessons

    rec = Recovery(1.5, 2.0, None, False, None, True)  # served again 2.0 s after T0, P95 never back
    reqs, samples, events = _timeline()
    inc = analyse(reqs, samples, events, p95_tolerance=0.5, window_s=1.0)
    inc = dataclasses.replace(inc, recovery=rec)
    wrong = lessons(inc)[1]
    head = _not_recovered(rec, inc.t0_s)
    assert not any("did not serve again" in w for w in wrong), wrong
    assert any(
        w.startswith("Not recovered: serving again after ") and w.split("Not recovered: ")[1] in head
        for w in wrong
    ), (wrong, head)
    monkeypatch.setattr(rep, "incident_of", lambda ctx: (inc, [inc]))
    block = rep.s_recovery(stand_in())[0]
    assert isinstance(block, Text), block
    verdict = block.text
    assert verdict.startswith("**Not recovered**: serving again after ") and "P95 latency" in verdict, verdict


def test_an_alert_firing_before_t0_keeps_its_sign_where_the_table_shows_it():
    """The JSON's alerts[].since_t0_s is the same signed figure as the report's alert table: an alert
    already firing before the failure is negative there (it was clamped to 0 before)."""
    from vramlab.report.incident_text import since_t0

    reqs, samples, events = _timeline()
    events = [*events, _ev(9.5, "alert", name="KvHigh", state="firing", source="evaluated")]
    inc = analyse(reqs, samples, events, p95_tolerance=0.5, window_s=1.0)
    early = next(a for a in inc.alerts if a["name"] == "KvHigh")
    assert math.isclose(early["since_t0_s"], -0.5)
    assert since_t0(early["t_s"], inc.t0_s) == f"{early['since_t0_s']:+.2f}" == "-0.50"


def test_time_to_alert_is_one_signed_figure_in_json_headline_and_lessons():
    """An alert still firing when T0 came is the incident's alert, at its negative offset, in the
    JSON and in the headline alike; one that fired and cleared during the baseline is not, and the
    lessons never say 'no alert fired' while the headline shows one."""
    from vramlab.report.incident_text import alert_clock, lessons

    reqs, samples, events = _timeline()
    events = [e for e in events if e.kind != "alert"]  # only the alerts written here
    still = [*events, _ev(9.5, "alert", name="KvHigh", state="firing", source="evaluated")]
    inc = analyse(reqs, samples, still, p95_tolerance=0.5, window_s=1.0)
    assert math.isclose(some(inc.time_to_alert_s), -0.5)
    assert alert_clock(inc).startswith("-0.50 s") and "before T0" in alert_clock(inc)
    assert not any("No alert fired" in w for w in lessons(inc)[1])

    cleared = [
        *events,
        _ev(5.0, "alert", name="KvHigh", state="firing", source="evaluated"),
        _ev(6.0, "alert", name="KvHigh", state="inactive", source="evaluated"),
        _ev(11.25, "alert", name="Errors", state="firing", source="evaluated"),
    ]
    inc = analyse(reqs, samples, cleared, p95_tolerance=0.5, window_s=1.0)
    t0 = some(inc.t0_s)
    assert math.isclose(some(inc.time_to_alert_s), 11.25 - t0)
    assert alert_clock(inc) == f"{11.25 - t0:.2f} s"

    none = [
        *events,
        _ev(5.0, "alert", name="KvHigh", state="firing", source="evaluated"),
        _ev(6.0, "alert", name="KvHigh", state="inactive", source="evaluated"),
    ]
    inc = analyse(reqs, samples, none, p95_tolerance=0.5, window_s=1.0)
    assert inc.time_to_alert_s is None and alert_clock(inc) == "–"
    assert any("No alert fired" in w for w in lessons(inc)[1])


def test_a_signal_already_past_its_threshold_in_the_baseline_is_never_the_first_abnormal_signal():
    # the demo's case: GPU memory share 99.0 % through the baseline (threshold 98 %), 98.1 % after T0
    share = Signal(
        "resource.gpu_memory_share",
        "resource",
        tuple([(t * 0.5, 0.99) for t in range(8)] + [(4.5, 0.981), (5.0, 0.985)]),
        SignalRule(threshold=0.98, min_delta=0.02),
    )
    errs = Signal(
        "user.error_rate",
        "user",
        ((1.0, 0.0), (2.0, 0.0), (5.5, 0.8)),
        SignalRule(threshold=0.05, deviation=False),
    )
    rep = first_abnormal([share, errs], t0_s=4.0, baseline_start_s=0.0)
    assert rep.noisy == ("resource.gpu_memory_share",)
    assert rep.first is not None and rep.first.name == "user.error_rate", rep.first
    assert [o.name for o in rep.order] == ["user.error_rate"]
    # the same crossing from a baseline below the threshold is an onset (the rule itself is unchanged)
    below = Signal(
        share.name, share.layer, tuple((t, 0.95 if t < 4.0 else v) for t, v in share.points), share.rule
    )
    o = onset_of(below, 4.0, 0.0)
    assert o is not None and (o.t_s, o.reason) == (4.5, "threshold")
