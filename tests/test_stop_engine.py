"""The one stop-condition engine (run/stop.py) that `vramlab run` and `vramlab drill` share:
timeouts arm the error stop, and a run against a target that never answers ends non-zero."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from vramlab.drill.detect import Detector
from vramlab.experiment.kind import ExperimentKind, RunOptions
from vramlab.experiment.plan import parse_plan
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.plandoc import StopConditions
from vramlab.run.events import EventHook
from vramlab.run.recorder import StoreRecorder
from vramlab.run.runner import Runner
from vramlab.run.stop import StopMonitor
from vramlab.store import open_store


def test_all_timeouts_fire_below_min_requests_and_an_answer_disarms_it():
    m = StopMonitor(StopConditions(error_rate=0.5, window_s=10, min_requests=10), wall_clock_s=1e9)
    assert m.check(0.5) is None
    m.on_request(1.0, False, "timeout", None)
    r = m.check(1.0)
    assert r is not None and r.condition == "error_rate" and "timed out (1/1)" in r.message
    m2 = StopMonitor(StopConditions(error_rate=0.5, window_s=10, min_requests=10), wall_clock_s=1e9)
    m2.on_request(1.0, False, "connect", None)  # an immediate error below min_requests: not yet
    assert m2.check(1.0) is None
    m2.on_request(1.1, True, None, 20.0)
    m2.on_request(1.2, False, "timeout", None)
    assert m2.check(1.2) is None  # something answered: below min_requests the rate is not judged
    # the timed-out requests leave the window like any other
    assert m.check(11.5) is None


def test_run_and_drill_stop_on_the_same_window_with_the_same_words():
    cond = StopConditions(error_rate=0.3, window_s=2.0, min_requests=4, wall_clock_s=100)
    m, d = StopMonitor(cond, 100.0), Detector(cond)
    feed = [
        (0.1, True, None),
        (0.2, False, "http_5xx"),
        (0.3, True, None),
        (0.4, False, "http_5xx"),
        (0.5, False, "http_5xx"),
    ]
    for t, ok, err in feed:
        m.on_request(t, ok, err, 10.0 if ok else None)
        d.on_result(t, ok, 200 if ok else 500, err, None, 10.0 if ok else None)
        r = m.check(t)
        f = d.failure()
        assert (r is None) == (f is None), t
        if r is not None:
            assert f is not None and f.kind == "error_rate" and f.message == r.message and t == 0.4
            break
    else:
        raise AssertionError("no stop")


def test_run_against_a_target_that_never_answers_stops_non_zero(tmp_path: Path):
    # the target accepts connections and never answers; `run` used to exit 0 "completed"
    # with "returned to baseline: yes" and 4 of 4 requests timed out (min_requests never reached)
    b = StubBehaviour(stall_until=time.monotonic() + 3600)
    store = open_store(str(tmp_path / "v.db"))

    async def go():
        async with StubServer(b) as srv:
            plan = parse_plan(f"""
name: hang
target: {{base_url: "{srv.url}", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 3, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: [2]}}
phases: {{duration_s: 1.5, drain_s: 0.2}}
rounds: 1
load: {{concurrency: 2, request_timeout_s: 0.5}}
stop_conditions: {{error_rate: 0.5, window_s: 10, min_requests: 10}}
""")
            hook = EventHook()
            hook.add(StoreRecorder(store))
            return await Runner(
                ExperimentKind(plan, RunOptions(samplers=[], capture_environment=False)), hook
            ).run()

    res = asyncio.run(asyncio.wait_for(go(), 60))
    assert res.status == "stopped" and res.exit_code != 0
    assert res.stop_reason is not None and res.stop_reason.condition == "error_rate"
    assert "timed out" in res.stop_reason.message
    run = store.get_run(res.run_id)
    assert run.status == "stopped" and "timed out" in (run.stop_reason or "")
    reqs = [r for r in store.requests(res.run_id) if r.error_class != "cancelled"]
    assert reqs and all(r.error_class == "timeout" for r in reqs)
    assert {r.phase for r in reqs} == {"baseline"}  # it stopped in the first window, nothing after
