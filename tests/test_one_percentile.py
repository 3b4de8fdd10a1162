"""One percentile definition: the stop condition, the report and every other P-figure agree.

The stop condition's P95 used nearest rank while the report's used linear interpolation, so a run
could stop on "P95 950 ms" and report a P95 of 947.5 ms for the same requests. Both now call
vramlab.records.stats.percentile; these tests feed the same window to both and compare.
"""

from __future__ import annotations

import random

import pytest

from vramlab.analysis.stats import Window
from vramlab.analysis.windows import summarize_window
from vramlab.plandoc import StopConditions
from vramlab.records import RequestRecord
from vramlab.records.stats import percentile
from vramlab.run.stop import StopMonitor


def _window_of_requests(seed: int, n: int) -> list[RequestRecord]:
    """A treatment window: heavy-tailed latencies, some failures, some requests cut off (cancelled)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sched = i * 0.05
        e2e = rng.lognormvariate(5.5, 0.6)  # median ~245 ms, a long tail
        lag = rng.expovariate(1 / 20)
        kind = rng.random()
        error_class, status = (
            ("http_5xx", 503) if kind < 0.08 else ("cancelled", 0) if kind < 0.12 else (None, 200)
        )
        out.append(
            RequestRecord(
                run_id="0123abcd",
                round=1,
                phase="treatment",
                step=0,
                step_value=8,
                request_id=f"r{i}",
                scheduled_s=sched,
                sent_s=sched + lag / 1000,
                end_s=sched + (lag + e2e) / 1000,
                e2e_ms=e2e,
                e2e_from_scheduled_ms=e2e + lag,
                status_code=status,
                error_class=error_class,
            )
        )
    return out


def _stop_p95(reqs: list[RequestRecord]) -> float:
    """The P95 the stop condition judges, over a window holding every request."""
    monitor = StopMonitor(
        StopConditions(p95_ms=1e-6, error_rate=None, min_requests=1, window_s=1e6), wall_clock_s=1e9
    )
    for r in reqs:
        monitor.on_request(r.end_s or 0.0, r.ok, r.error_class, r.e2e_from_scheduled_ms)
    reason = monitor.check(max(r.end_s or 0.0 for r in reqs))
    assert reason is not None and reason.condition == "p95_ms"
    return reason.value


@pytest.mark.parametrize("seed,n", [(1, 20), (2, 21), (3, 137), (4, 400)])
def test_stop_condition_p95_is_the_report_p95_of_the_same_window(seed: int, n: int) -> None:
    reqs = _window_of_requests(seed, n)
    end = max(r.end_s or 0.0 for r in reqs)
    window = Window(round=1, phase="treatment", step=0, start_s=0.0, end_s=end, step_value=8)
    report = summarize_window(window, reqs, []).metrics()
    assert _stop_p95(reqs) == report["e2e_sched_p95_ms"]


def test_a_tail_the_two_old_definitions_disagreed_on() -> None:
    """19 fast and 3 slow requests: nearest rank said 950 ms, the report 947.5 ms."""
    lat = [100.0] * 19 + [900.0, 950.0, 950.0]
    reqs = [
        RequestRecord(
            run_id="0123abcd",
            round=1,
            phase="treatment",
            request_id=f"r{i}",
            scheduled_s=i * 0.1,
            sent_s=i * 0.1,
            end_s=i * 0.1 + v / 1000,
            e2e_ms=v,
            e2e_from_scheduled_ms=v,
            status_code=200,
        )
        for i, v in enumerate(lat)
    ]
    window = Window(round=1, phase="treatment", step=None, start_s=0.0, end_s=3.1)
    assert (
        _stop_p95(reqs)
        == summarize_window(window, reqs, []).metrics()["e2e_sched_p95_ms"]
        == pytest.approx(947.5)
    )
    assert percentile(lat, 95) == pytest.approx(947.5)


def test_infinite_values_stay_infinite() -> None:
    """pack reports a request whose model never loaded as an infinite wait: never nan."""
    inf = float("inf")
    assert percentile([inf, inf], 50) == inf and percentile([1.0, inf], 50) == inf
    assert percentile([1.0, 2.0, inf, inf], 95) == inf


def test_the_runners_console_and_event_p95_is_the_reports():
    # the per-window P95 on the console and in the step event used nearest rank (950 vs 947.5 ms)
    from vramlab.experiment.kind import _WindowStats

    w = _WindowStats(e2e=[100.0 * i for i in range(1, 21)])  # 100..2000 ms
    assert w.p(0.95) == pytest.approx(percentile(w.e2e, 95))
    assert w.p(0.95) != sorted(w.e2e)[18]  # not nearest rank (1900 ms)
    assert _WindowStats().p(0.95) is None
