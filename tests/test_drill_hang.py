"""A hang, end to end against the sim: the engine stops producing tokens while /health stays 200.

Requests time out, the error-rate stop ends the ramp, the failure mode is named `hang`, and since a
health-based supervisor never sees anything wrong, the drill reports "not recovered" within its
limit and still rolls back. The clients retry with exponential back-off and jitter, so the same
drill checks that the waits between a request's attempts grow and stay inside the policy's bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from _narrow import some
from vramlab.analysis.incident import analyse
from vramlab.drill.kind import DrillKind
from vramlab.drill.plan import parse_plan
from vramlab.drill.start import run_drill_kind
from vramlab.load.retry import RetryPolicy
from vramlab.store import open_store

pytestmark = pytest.mark.slow

# jitter 0.5: each wait is drawn from [full/2, full] with full = min(max_s, base_s * 2**attempt), so the
# lower bound of one wait is the upper bound of the one before: [0.1, 0.2], [0.2, 0.4], [0.4, 0.8]
CLIENTS: dict[str, Any] = {
    "policy": "exponential",
    "max_attempts": 4,
    "base_s": 0.2,
    "max_s": 0.8,
    "jitter": 0.5,
}
HANG_AFTER_S = 2.5  # after the sim is ready: past the 1 s baseline, inside the first ramp step


def _doc(tmp_path: Path) -> dict:
    return {
        "kind": "drill",
        "name": "hang-drill",
        "rounds": 1,
        "baseline_s": 1.0,
        "target": {
            "kind": "sim",
            "environment": "test",
            "engine": "vllm",
            "sim": {
                "model": "qwen2.5-0.5b-instruct",
                "gpu": "l4",
                "engine": "vllm",
                "max_model_len": 4096,
                "speed": 200,
                "device": str(tmp_path / "gpu.ledger"),
                "extra_args": ["--fault", f"hang@{HANG_AFTER_S:g}"],
            },
        },
        "load": {
            "concurrency": 4,
            "prompt_tokens": 64,
            "max_tokens": 8,
            "request_timeout_s": 1.0,
            "retry": CLIENTS,
        },
        "ramp": {
            "knob": "concurrency",
            "mode": "geometric",
            "start": 4,
            "factor": 2,
            "ceiling": 16,
            "step_s": 2.5,
        },
        "stop_conditions": {"error_rate": 0.5, "window_s": 1.0, "min_requests": 3, "wall_clock_s": 40},
        "recovery": {"mode": "auto", "limit_s": 8, "observe_s": 0.5, "liveness_grace_s": 2},
        "rollback": [f"touch {tmp_path / 'rolled-back'}"],
    }


def test_hang_is_named_detected_not_recovered_and_rolled_back(tmp_path):
    store = open_store(str(tmp_path / "s.db"))
    runner = DrillKind(parse_plan(_doc(tmp_path)), store)
    result = asyncio.run(asyncio.wait_for(run_drill_kind(runner, store), 40))
    rid = runner.run_id
    events = store.events(rid)
    requests = store.requests(rid)
    inc = analyse(requests, store.samples(rid), events, p95_tolerance=2.0)

    assert result.status == "completed" and result.failed_rounds == [0]
    assert result.unrecovered_rounds == [0]  # `vramlab drill` exits 1 on it
    assert inc.failed and inc.failure_mode == "hang"
    assert any("request timed out" in e for e in inc.evidence) and any(
        "process stayed up" in e for e in inc.evidence
    )
    kinds = [e.kind for e in events]
    assert "process_exit" not in kinds and "oom" not in kinds  # alive and silent, nothing in the log
    assert [e.data["mode"] for e in events if e.kind == "failure_mode"] == ["hang"]
    assert inc.time_to_detect_s is not None and 0 < inc.time_to_detect_s < 5
    assert inc.impact.error_classes.get("timeout", 0) > 0
    # every request in flight at the hang ends as what it was: timed out, never "cancelled" by the move
    # to recovery; the impact table counts exactly those in flight at T0
    t0 = some(inc.t0_s)
    lost = [r for r in requests if some(r.sent_s) <= t0 + 1e-9 and some(r.end_s) >= t0 - 1e-9 and not r.ok]
    why = (t0, inc.evidence, [(r.phase, r.error_class, r.sent_s, r.end_s) for r in lost])
    assert lost and all(r.error_class == "timeout" and r.phase == "ramp" for r in lost), why
    assert not any(r.error_class == "cancelled" and r.phase == "ramp" for r in requests)
    assert inc.impact.in_flight_lost == len(lost) and some(inc.trigger).in_flight_at_t0 == len(lost), why
    # /health stayed 200, so the drill's supervisor (restart on exit or on failing health) never acted:
    # a liveness probe on /health does not catch a hang, which is the finding
    assert "mitigation" not in kinds and "not_recovered" in kinds and not inc.recovery.recovered
    assert any(e.kind == "rollback" and "stop the target" in e.message for e in events)
    assert (tmp_path / "rolled-back").exists()
    from vramlab.sim.ledger import DeviceLedger

    assert DeviceLedger(str(tmp_path / "gpu.ledger")).memory_info(0)[1] == 0  # the sim is gone from the card

    # exponential back-off with jitter: per attempt, the wait before the next one
    policy = RetryPolicy(**CLIENTS)
    chains: dict[str, list] = {}
    for r in requests:
        chains.setdefault(r.request_id, []).append(r)
    waits: dict[int, list[float]] = {}
    for chain in chains.values():
        chain.sort(key=lambda r: r.attempt)
        assert [r.attempt for r in chain] == list(range(len(chain))) and len(chain) <= CLIENTS["max_attempts"]
        for a, b in zip(chain, chain[1:], strict=False):
            assert a.error_class == "timeout", a  # only failures are retried
            waits.setdefault(a.attempt, []).append(b.sent_s - a.end_s)
    assert sorted(waits) == [0, 1, 2], "no request used all 4 attempts against the hung target"
    slack_s = 0.35  # a loaded 2-core box wakes late; it never wakes early
    for attempt, ws in waits.items():
        full = min(policy.max_s, policy.base_s * 2**attempt)
        assert min(ws) >= full * (1 - policy.jitter) - 0.01, (attempt, ws)
        assert max(ws) <= full + slack_s, (attempt, ws)
    means = [sum(waits[a]) / len(waits[a]) for a in (0, 1, 2)]
    assert means[0] < means[1] < means[2], means


def test_a_sigstopped_target_is_found_hung_from_health_before_any_request_times_out(tmp_path):
    # the sim is SIGSTOPped mid-step: its socket accepts, nothing answers, /health too. The requests' own
    # timeout (60 s) never fires inside the drill: the hang is found from health failing for the liveness
    # grace while the requests in flight make no progress; they are stored as timeouts at the hang, counted
    # lost at T0, and the supervisor restarts the stopped sim (SIGKILL at once)
    import os
    import signal
    import time

    from vramlab.drill.local_targets import SimTarget

    doc = _doc(tmp_path)
    doc["target"]["sim"]["extra_args"] = []
    doc["load"] = {**doc["load"], "request_timeout_s": 60.0, "retry": {"policy": "none"}, "max_tokens": 32}
    doc["ramp"] = {**doc["ramp"], "step_s": 4.0}
    doc["stop_conditions"]["wall_clock_s"] = 90
    doc["recovery"] = {"mode": "auto", "limit_s": 30, "observe_s": 0.5, "liveness_grace_s": 1.5}
    store = open_store(str(tmp_path / "s.db"))
    runner = DrillKind(parse_plan(doc), store)
    stopped: list[int] = []

    def hang() -> None:
        target = runner.target
        assert isinstance(target, SimTarget) and target._proc is not None
        stopped.append(target._proc.pid)
        os.kill(stopped[0], signal.SIGSTOP)

    def on_event(ev: Any) -> None:
        if ev.kind == "step" and ev.data.get("step") == 2 and not stopped:
            asyncio.get_running_loop().call_later(1.0, hang)

    t = time.monotonic()
    try:
        result = asyncio.run(asyncio.wait_for(run_drill_kind(runner, store, subscribers=[on_event]), 90))
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
    took = time.monotonic() - t
    assert stopped and result.failed_rounds == [0] and result.unrecovered_rounds == [], result
    rid = runner.run_id
    events, requests = store.events(rid), store.requests(rid)
    fault = next(e for e in events if e.kind == "fault")
    assert fault.data["value"] == 8 and fault.data["mode"] == "hang", fault.data  # the step it hung in
    detect = next(e for e in events if e.kind == "detect")
    assert detect.data["condition"] == "hang" and "in flight answered" in detect.message, detect.message
    assert took < 60, took  # never waited for the 60 s request timeout
    inc = analyse(requests, store.samples(rid), events, p95_tolerance=50)
    assert inc.failure_mode == "hang" and inc.recovery.recovered, (inc.failure_mode, inc.recovery)
    t0 = some(inc.t0_s)
    lost = [r for r in requests if some(r.sent_s) <= t0 + 1e-9 and some(r.end_s) >= t0 - 1e-9 and not r.ok]
    assert lost and all(r.error_class == "timeout" and r.phase == "ramp" for r in lost), lost[:3]
    assert all("the target hung" in (r.error or "") for r in lost)
    assert not any(r.error_class == "cancelled" and r.phase == "ramp" for r in requests)
    assert inc.impact.in_flight_lost == len(lost)
    restart = next(e for e in events if e.kind == "mitigation")
    assert "SIGKILL at once" in restart.message, restart.message
