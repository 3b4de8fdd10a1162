"""Analysis: the percentile method, per-window summaries, phase comparison, stability, recovery."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _synthetic_run as synth
from _narrow import some
from vramlab.analysis.run import analyze_run
from vramlab.analysis.stats import Distribution, Slo, summarize_requests
from vramlab.records import EventRecord, RequestRecord
from vramlab.records.stats import percentile

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


def test_percentile_type7_known_values():
    xs = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert percentile(xs, 0) == 15.0
    assert percentile(xs, 100) == 50.0
    assert percentile(xs, 50) == 35.0
    assert percentile(xs, 40) == pytest.approx(29.0)  # h = 1.6: 20 + 0.6 * 15
    assert percentile(xs, 95) == pytest.approx(48.0)  # h = 3.8: 40 + 0.8 * 10
    assert percentile([7.0], 99) == 7.0
    assert percentile(list(range(101)), 99) == 99.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, min_size=1, max_size=60), st.floats(0, 100), st.floats(0, 100))
def test_percentile_monotone_and_bounded(xs, p, q):
    lo, hi = sorted((p, q))
    a, b = percentile(xs, lo), percentile(xs, hi)
    assert min(xs) <= a <= b <= max(xs)


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_percentile_ignores_order(xs, rnd):
    shuffled = list(xs)
    rnd.shuffle(shuffled)
    for p in (50, 95, 99):
        assert percentile(xs, p) == percentile(shuffled, p)


def _req(i: int, e2e: float, ok: bool, tokens: int) -> RequestRecord:
    return RequestRecord(
        run_id="00000000",
        round=0,
        phase="baseline",
        request_id=str(i),
        sent_s=float(i),
        end_s=i + e2e / 1000,
        e2e_ms=e2e,
        ttft_ms=e2e / 3,
        output_tokens=tokens if ok else 0,
        status_code=200 if ok else 0,
        error_class=None if ok else "timeout",
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.1, 1e5), st.booleans(), st.integers(0, 4096)), min_size=1, max_size=40),
    st.randoms(use_true_random=False),
)
def test_request_summary_invariant_to_order(rows, rnd):
    reqs = [_req(i, *row) for i, row in enumerate(rows)]
    shuffled = list(reqs)
    rnd.shuffle(shuffled)
    assert summarize_requests(reqs, 10.0) == summarize_requests(shuffled, 10.0)


def test_request_summary_numbers():
    reqs = [_req(i, 100.0 + 10 * i, ok=i % 5 != 0, tokens=50) for i in range(20)]
    s = summarize_requests(reqs, duration_s=4.0, slo=Slo(e2e_ms=200.0))
    assert (s.count, s.ok, s.errors, s.errors_by_class) == (20, 16, 4, {"timeout": 4})
    assert s.error_rate == 0.2
    assert s.throughput_rps == 4.0 and s.output_tok_s == 200.0
    assert s.goodput_rps == 8 / 4.0  # ok and e2e <= 200 ms: i in 1..10 minus i=5, 10
    assert s.e2e == Distribution.of(r.e2e_ms for r in reqs if r.error_class is None)
    assert some(s.e2e).max == 290.0 and some(s.e2e).count == 16


def test_analysis_of_synthetic_run():
    a = analyze_run(*synth.build())
    assert a.complete and a.warnings == [] and a.rounds == [0, 1, 2]
    # one window per (round, phase, step): 3 rounds x (baseline + 3 steps + recovery)
    assert len(a.steps) == 15 and len(a.phases) == 9
    step8 = [s for s in a.steps if s.window.step_value == 8.0]
    # 800 + 190; round 1 lost its 5 fastest to 503s: 16 left, h = 14.25 -> 990 + 0.25 * 10
    assert [some(s.requests.e2e).p95 for s in step8] == [990.0, 992.5, 990.0]
    assert [s.requests.errors for s in step8] == [0, 5, 0]
    assert step8[1].requests.errors_by_class == {"http_5xx": 5}
    assert step8[0].resources.worst["engine.kv_cache_usage_perc"] == 0.8
    assert step8[0].resources.worst["gpu.memory_used_bytes"] == 70 * synth.GIB + 2 * synth.GIB
    base = a.phases[0]
    assert (
        base.window.phase == "baseline"
        and some(base.requests.e2e).p50 == 200.0
        and some(base.requests.e2e).p99 == 298.0
    )
    assert some(base.requests.e2e_sched).p95 == 292.0  # from scheduled: 2 ms earlier
    # comparison: treatment vs baseline in round 0
    d = a.comparisons[0].deltas["treatment"]["e2e_p95_ms"]
    assert d.baseline == 290.0 and d.value > 900 and d.delta == d.value - 290.0
    # stability: the 503s of round 1 are a one-off; round 2's slow recovery too
    spikes = {(s.phase, s.step, s.metric): s.spikes for s in a.stability if s.spikes}
    assert spikes[("treatment", 2, "error_rate")] == [1]
    assert spikes[("recovery", 0, "e2e_p95_ms")] == [2]
    assert not any(m == "e2e_p95_ms" and ph == "treatment" for ph, _, m in spikes)
    # recovery: rounds 0 and 1 back at once; round 2 only after its slow first seconds
    rec = {r.round: r for r in a.recovery}
    assert rec[0].returned and rec[0].after_s == 0.0
    assert rec[2].returned and 4.0 < some(rec[2].after_s) < 6.5 and some(rec[2].recovery_e2e_p95_ms) > 1000
    assert [b.phase for b in a.bands] == ["baseline", "recovery"] and a.bands[0].e2e_p95_ms == (290.0, 290.0)
    assert [p.step_value for p in a.step_points[:3]] == [2.0, 4.0, 8.0]
    assert set(a.timeline) == {"gpu.memory_used_bytes", "engine.kv_cache_usage_perc"}


def test_analysis_invariant_to_record_order():
    run, reqs, samples, events = synth.build()
    rnd = random.Random(7)
    for xs in (reqs, samples, events):
        rnd.shuffle(xs)
    a, b = analyze_run(*synth.build()), analyze_run(run, reqs, samples, events)
    assert a.steps == b.steps and a.phases == b.phases and a.stability == b.stability
    assert a.recovery == b.recovery and a.totals == b.totals


def test_recovery_not_returned_and_warnings():
    run, reqs, samples, events = synth.build(status="running")
    # round 0 recovery: errors all the way to the end
    reqs = [
        r.model_copy(update={"status_code": 0, "error_class": "connect"})
        if r.round == 0 and r.phase == "recovery" and r.request_id.endswith(("-18", "-19", "-20"))
        else r
        for r in reqs
    ]
    reqs = [
        r.model_copy(update={"dispatch_lag_ms": 40.0}) if r.round == 2 and r.step == 1 else r for r in reqs
    ]
    a = analyze_run(run, reqs, samples, events)
    rec = {r.round: r for r in a.recovery}
    assert not rec[0].returned and rec[0].after_s is None and "error rate" in rec[0].reason
    assert not a.complete
    assert any(w.startswith("incomplete run") for w in a.warnings)
    assert any("client fell behind in round 2 treatment step 1" in w and "40.0 ms" in w for w in a.warnings)


def test_fewer_rounds_warns():
    run, reqs, samples, events = synth.build()
    keep = [r for r in reqs if r.round == 0]
    a = analyze_run(
        run, keep, [s for s in samples if s.t_s < 60], [e for e in events if e.round in (0, None)]
    )
    assert any("only 1 round" in w for w in a.warnings)
    assert all(not s.spikes for s in a.stability)


def test_lag_warning_not_repeated_when_the_runner_already_warned():
    run, reqs, samples, events = synth.build()
    reqs = [
        r.model_copy(update={"dispatch_lag_ms": 40.0}) if r.round in (0, 2) and r.step == 1 else r
        for r in reqs
    ]
    events.append(
        EventRecord(
            run_id=run.run_id,
            t_s=30.0,
            kind="warning",
            round=0,
            phase="treatment",
            step=1,
            message="the load generator fell behind",
            data={"dispatch_lag_p99_ms": 40.0},
        )
    )
    lag = [w for w in analyze_run(run, reqs, samples, events).warnings if "fell behind" in w]
    assert len(lag) == 1 and "round 2 treatment step 1" in lag[0]


def test_thresholds_from_the_plan():
    a = analyze_run(*synth.build())  # plan metrics: p95_e2e_ms <= 950, error_rate <= 5%
    assert len(a.thresholds) == 15 * 2
    breaches = {(c.round, c.step_value, c.metric) for c in a.thresholds if c.passed is False}
    assert breaches == {
        (0, 8.0, "p95_e2e_ms"),
        (1, 8.0, "p95_e2e_ms"),
        (2, 8.0, "p95_e2e_ms"),
        (1, 8.0, "error_rate"),
        (2, None, "p95_e2e_ms"),
    }
    assert a.highest_passing_value == 4.0
    # goodput uses the e2e limit as the per-request SLO: at concurrency 8 (e2e 800..1000 ms)
    # the 16 requests at or under 950 ms are good in round 0
    step8 = next(s for s in a.steps if s.window.round == 0 and s.window.step_value == 8.0)
    assert step8.requests.goodput_rps == pytest.approx(16 / step8.window.duration_s)


def test_threshold_names_and_limits():
    from vramlab.analysis.thresholds import check_thresholds, highest_passing_value, slo_from_metrics

    assert slo_from_metrics({"p95_ttft_ms": 500, "p99_ttft_ms": 800, "error_rate": 0.01}) == Slo(
        ttft_ms=500.0
    )
    assert slo_from_metrics({"error_rate": 0.01}) is None
    a = analyze_run(*synth.build())
    checks = check_thresholds({"p90_itl_ms": 4.0, "min_goodput_rps": 1.0, "max_tpot_ms": 5.0}, a.steps[:2])
    got = {(c.metric, c.phase): (c.value, c.passed) for c in checks}
    assert [s.window.phase for s in a.steps[:2]] == ["baseline", "treatment"]
    assert got[("p90_itl_ms", "baseline")] == (5.0, False)  # every inter-token latency is 5 ms
    assert got[("max_tpot_ms", "treatment")] == (5.0, True)
    # goodput under the plan's SLO (e2e <= 950 ms): all 21 baseline requests are good
    goodput, passed = got[("min_goodput_rps", "baseline")]
    assert goodput == pytest.approx(21 / a.steps[0].window.duration_s) and passed is True
    plain = analyze_run(*synth.build(), slo=None)
    assert plain.steps[0].requests.goodput_rps is not None  # the plan's metrics still give the SLO
    bare_run = synth.run_record().model_copy(update={"plan": {}})
    _, reqs, samples, events = synth.build()
    bare = analyze_run(bare_run, reqs, samples, events)
    assert bare.thresholds == [] and bare.steps[0].requests.goodput_rps is None
    assert highest_passing_value([]) is None


def test_cancelled_requests_are_counted_apart():
    reqs = [_req(i, 100.0, ok=True, tokens=10) for i in range(8)]
    cut = [
        r.model_copy(update={"error_class": "cancelled", "status_code": 0, "request_id": f"c{i}"})
        for i, r in enumerate(reqs[:2])
    ]
    s = summarize_requests(reqs + cut, 4.0)
    assert (s.count, s.errors, s.error_rate, s.cancelled) == (8, 0, 0.0, 2)


def test_two_loners_are_unstable_not_a_one_off():
    # P95s in the proportion 75 : 88 : 45, each round alone against the median of the other two
    run, reqs, samples, events = synth.build()
    factor = {0: 1.0, 1: 88 / 75, 2: 45 / 75}
    reqs = [
        r.model_copy(update={"e2e_ms": some(r.e2e_ms) * factor[r.round]})
        if r.phase == "treatment" and r.step == 0
        else r
        for r in reqs
    ]
    cell = next(
        s
        for s in analyze_run(run, reqs, samples, events).stability
        if (s.phase, s.step, s.metric) == ("treatment", 0, "e2e_p95_ms")
    )
    assert cell.by_round == pytest.approx({0: 390.0, 1: 457.6, 2: 234.0})
    assert cell.spikes == [] and cell.unstable
    steady = next(
        s
        for s in analyze_run(*synth.build()).stability
        if (s.phase, s.step, s.metric) == ("treatment", 0, "e2e_p95_ms")
    )
    assert not steady.unstable and steady.spikes == []


def test_a_round_where_every_request_timed_out_never_returned_to_baseline():
    # against a target that never answers, "returned to baseline: yes" with 4/4 timed out
    run, reqs, samples, events = synth.build()
    hung = [
        r.model_copy(
            update={"status_code": 0, "error_class": "timeout", "e2e_ms": None, "output_tokens": None}
        )
        if r.round == 0 and r.phase in ("baseline", "recovery")
        else r
        for r in reqs
    ]
    rec = {r.round: r for r in analyze_run(run, hung, samples, events).recovery}
    assert not rec[0].returned and rec[0].after_s is None
    assert "no request succeeded" in rec[0].reason and "timed out" in rec[0].reason
    assert rec[1].returned  # the other rounds are untouched


def test_returned_to_baseline_is_judged_on_the_whole_stretch_not_the_last_bin():
    # one slow request in the last second of a 10 s recovery: the last bin's P95 alone is 36 % over the
    # baseline's (tolerance 20 %); the recovery window as a whole is within it, and that is the verdict
    run, reqs, samples, events = synth.build()
    last = max((r for r in reqs if r.round == 0 and r.phase == "recovery"), key=lambda r: some(r.sent_s))
    slow = [r.model_copy(update={"e2e_ms": 400.0}) if r is last else r for r in reqs]
    rec = {r.round: r for r in analyze_run(run, slow, samples, events).recovery}
    assert rec[0].returned and rec[0].after_s == 0.0 and rec[0].judged, rec[0]


def test_returned_to_baseline_says_when_too_few_requests_to_judge():
    run, reqs, samples, events = synth.build()
    keep = sorted((r for r in reqs if r.round == 0 and r.phase == "recovery"), key=lambda r: some(r.sent_s))[
        :7
    ]
    few = [r for r in reqs if not (r.round == 0 and r.phase == "recovery") or r in keep]
    a = analyze_run(run, few, samples, events)
    rec = {r.round: r for r in a.recovery}
    assert not rec[0].returned and not rec[0].judged and "too few requests to judge: 7" in rec[0].reason
    assert rec[1].judged and rec[1].returned
