"""`change.soak`: one long treatment window cut into windows compared with the first: memory growth
per hour, latency and error drift, restarts seen, and a verdict with its reasons."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from vramlab.analysis.soak import GIB, soak_result
from vramlab.experiment.plan import Change
from vramlab.records import EventRecord, RequestRecord, SampleRecord

VRAMLAB = str(Path(sys.executable).with_name("vramlab"))
LIMITS = {
    "window_s": 600.0,
    "max_memory_growth_gib_per_h": 0.5,
    "max_latency_drift": 0.25,
    "max_error_drift": 0.01,
}


def _requests(hours: float, e2e_ms=lambda t: 100.0, failing=lambda t: False) -> list[RequestRecord]:
    out = []
    for i in range(int(hours * 3600 / 10)):  # one every 10 s
        t = i * 10.0
        bad = failing(t)
        out.append(
            RequestRecord(
                run_id="r",
                round=1,
                phase="treatment",
                step=1,
                request_id=str(i),
                sent_s=t,
                end_s=t + 0.1,
                ttft_ms=20.0,
                e2e_ms=e2e_ms(t),
                status_code=500 if bad else 200,
                error_class="http_5xx" if bad else None,
            )
        )
    return out


def _memory(hours: float, gib_at=lambda t: 20.0) -> list[SampleRecord]:
    return [
        SampleRecord(run_id="r", t_s=t, source="ledger", name="gpu.memory_used_bytes", value=gib_at(t) * GIB)
        for t in range(0, int(hours * 3600), 30)
    ]


def test_a_steady_target_is_stable():
    r = soak_result(LIMITS, _requests(1), _memory(1), [], (0.0, 3600.0))
    assert r.verdict == "stable" and not r.reasons and len(r.windows) == 6
    assert r.memory_growth_gib_per_h == pytest.approx(0.0, abs=1e-9) and r.restarts == 0


def test_a_leak_a_slowdown_errors_and_a_restart_each_make_it_drift():
    leak = soak_result(LIMITS, _requests(1), _memory(1, lambda t: 20.0 + t / 3600), [], (0.0, 3600.0))
    assert leak.verdict == "drifted" and leak.memory_growth_gib_per_h == pytest.approx(1.0, rel=0.05)
    assert leak.reasons == ["memory grew 1.00 GiB/h (limit 0.5)"]
    slower = soak_result(LIMITS, _requests(1, e2e_ms=lambda t: 100.0 + t / 36), _memory(1), [], (0.0, 3600.0))
    assert slower.verdict == "drifted" and slower.latency_drift is not None and slower.latency_drift > 0.25
    errors = soak_result(
        LIMITS, _requests(1, failing=lambda t: t > 3000 and int(t) % 20 == 0), _memory(1), [], (0.0, 3600.0)
    )
    assert errors.verdict == "drifted" and errors.error_drift > 0.01
    health = [
        SampleRecord(
            run_id="r", t_s=t, source="health", name="health.up", value=0.0 if 1800 <= t < 1830 else 1.0
        )
        for t in range(0, 3600, 10)
    ]
    restarted = soak_result(LIMITS, _requests(1), _memory(1) + health, [], (0.0, 3600.0))
    assert restarted.restarts == 1 and restarted.reasons == ["1 restart(s) seen"]
    exited = [EventRecord(run_id="r", t_s=100.0, kind="process_exit", message="exit 1", data={})]
    assert soak_result(LIMITS, _requests(1), _memory(1), exited, (0.0, 3600.0)).restarts == 1


def test_one_window_is_too_short_to_judge():
    r = soak_result({"window_s": 600.0}, _requests(0.1), _memory(0.1), [], (0.0, 360.0))
    assert r.verdict == "too short" and len(r.windows) == 1


def test_the_plan_needs_two_windows_and_one_way_of_changing():
    c = Change.model_validate(
        {"variable": "concurrency", "soak": {"value": 8, "duration_s": 3600, "window_s": 300}}
    )
    assert c.values() == [8]
    for bad in (
        {"variable": "concurrency", "soak": {"value": 8, "duration_s": 100, "window_s": 60}},
        {"variable": "concurrency", "steps": [2], "soak": {"value": 8, "duration_s": 100, "window_s": 10}},
    ):
        with pytest.raises(ValidationError):
            Change.model_validate(bad)


PLAN = """kind: experiment
name: soak
target:
  kind: sim
  model: qwen2.5-1.5b-instruct
  sim: {gpu: l4, engine: vllm, speed: 20, max_model_len: 4096, max_num_seqs: 16, seed: 7}
fixed:
  input: {synthetic: {prompt_tokens: 128, output_tokens: 16, seed: 7, count: 50}}
  ignore_eos: true
change:
  variable: concurrency
  baseline: 1
  soak: {value: 4, duration_s: 6, window_s: 2, max_latency_drift: 5.0}
phases: {duration_s: 1, drain_s: 1}
rounds: 1
load: {mode: closed, concurrency: 1}
samplers: {interval_s: 0.25, sources: [ledger, engine, health]}
"""


@pytest.mark.slow
def test_a_soak_on_the_rehearsal_server(tmp_path):
    db = str(tmp_path / "v.db")
    (tmp_path / "plan.yaml").write_text(PLAN)
    r = subprocess.run(
        [VRAMLAB, "run", str(tmp_path / "plan.yaml"), "--db", db, "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    run_id = json.loads(r.stdout)["run_id"]
    rep = subprocess.run(
        [VRAMLAB, "report", run_id, "--db", db, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    [soak] = report["sections"]["soak"]
    # the treatment ran the soak's own 6 s, not the phases' 1 s: three 2 s windows
    [treatment] = [w for w in report["steps"] if w["phase"] == "treatment"]
    assert treatment["duration_s"] >= 5.5
    assert len(soak["windows"]) >= 3 and all(w["requests"] > 0 for w in soak["windows"])
    assert soak["memory_source"] == "gpu.memory_used_bytes" and soak["restarts"] == 0
    assert soak["verdict"] == "stable", soak["reasons"]
