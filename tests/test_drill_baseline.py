"""Baseline sanity: a drill whose baseline already breaches its own error threshold stops before the
ramp, says why in the server's words, claims no ceiling and no fault, and `vramlab drill` exits 1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from vramlab.drill.kind import DrillKind
from vramlab.drill.plan import parse_plan
from vramlab.drill.start import run_drill_kind
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.report import load_context, render
from vramlab.report.incident import summary_line
from vramlab.store import open_store

SERVER_SAYS = "The model `tiny` does not exist."


def _drill(tmp_path: Path, b: StubBehaviour, timeout_s: float = 5.0):
    store = open_store(str(tmp_path / "s.db"))

    async def go():
        async with StubServer(b) as srv:
            plan = parse_plan(
                {
                    "name": "broken-baseline",
                    "rounds": 1,
                    "baseline_s": 1.0,
                    "target": {
                        "kind": "command",
                        "environment": "test",
                        "engine": "vllm",
                        "base_url": srv.url,
                        "model": "tiny",
                        "commands": {"status": "true"},
                    },
                    "load": {
                        "concurrency": 2,
                        "prompt_tokens": 8,
                        "max_tokens": 4,
                        "request_timeout_s": timeout_s,
                    },
                    "ramp": {
                        "knob": "concurrency",
                        "mode": "geometric",
                        "start": 2,
                        "factor": 2,
                        "ceiling": 4,
                        "step_s": 1.0,
                    },
                    "stop": {"error_rate": 0.5, "window_s": 1.0, "min_requests": 3, "wall_clock_s": 30},
                    "recovery": {"mode": "auto", "limit_s": 2, "observe_s": 0.5},
                }
            )
            runner = DrillKind(plan, store, workdir=str(tmp_path / "work"))
            return runner, await asyncio.wait_for(run_drill_kind(runner, store), 40)

    runner, result = asyncio.run(go())
    return store, runner, result


def test_every_baseline_request_failing_stops_the_drill_before_the_ramp(tmp_path):
    b = StubBehaviour(fail_status=404, fail_body=json.dumps({"error": {"message": SERVER_SAYS}}))
    store, runner, result = _drill(tmp_path, b)
    events = store.events(runner.run_id)
    kinds = [e.kind for e in events]
    assert result.status == "stopped" and result.failed_rounds == []
    assert "step" not in kinds and "fault" not in kinds and "ceiling" not in kinds, kinds
    assert result.stop_reason.startswith("baseline broken, nothing ramped: ")
    assert SERVER_SAYS in result.stop_reason and "at or past the error-rate stop 50%" in result.stop_reason
    line = summary_line(load_context(store, runner.run_id))
    assert line == result.stop_reason  # the headline says it, not "no OOM up to ..."
    assert "held at the ceiling" not in render(load_context(store, runner.run_id), "md")
    # `vramlab runs` names the drill's model (its served name, for a target that is not the sim)
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "runs", "--db", store.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith(runner.run_id))
    assert row.split()[1] == "drill" and row.rstrip().endswith(" tiny"), res.stdout


def test_a_target_that_never_answers_is_refused_before_the_ramp(tmp_path):
    import time

    b = StubBehaviour(stall_until=time.monotonic() + 3600)
    store, runner, result = _drill(tmp_path, b, timeout_s=30.0)
    kinds = [e.kind for e in store.events(runner.run_id)]
    assert result.status == "stopped" and "step" not in kinds and "ceiling" not in kinds
    assert "no baseline request came back" in (result.stop_reason or ""), result.stop_reason


def test_a_wall_clock_stop_over_refused_requests_never_says_nothing_had_failed(tmp_path):
    # the baseline is fine; every ramp request gets HTTP 400 (the context is too long for the engine):
    # the drill's clock runs out, and its line says what the step's requests got, in the server's words
    said = "This model's maximum context length is 4096 tokens"
    b = StubBehaviour()
    store = open_store(str(tmp_path / "s.db"))

    async def go():
        async with StubServer(b) as srv:
            plan = parse_plan(
                {
                    "name": "refused-ramp",
                    "rounds": 1,
                    "baseline_s": 0.8,
                    "target": {
                        "kind": "command",
                        "environment": "test",
                        "engine": "vllm",
                        "base_url": srv.url,
                        "model": "tiny",
                        "commands": {"status": "true"},
                    },
                    "load": {"concurrency": 2, "prompt_tokens": 8, "max_tokens": 4, "request_timeout_s": 2},
                    "ramp": {
                        "knob": "concurrency",
                        "mode": "geometric",
                        "start": 2,
                        "factor": 2,
                        "ceiling": 64,
                        "step_s": 30.0,
                    },
                    "stop": {
                        "error_rate": 1.0,
                        "window_s": 1.0,
                        "min_requests": 3,
                        "wall_clock_s": 6,  # room for a busy machine to end a request of the step
                    },  # never fires
                }
            )
            runner = DrillKind(plan, store, workdir=str(tmp_path / "work"))

            def on_event(ev) -> None:
                if ev.kind == "phase_end" and ev.message == "baseline":
                    b.fail_status, b.fail_body = 400, json.dumps({"error": {"message": said}})

            return runner, await asyncio.wait_for(run_drill_kind(runner, store, subscribers=[on_event]), 40)

    runner, result = asyncio.run(go())
    stopped = [e for e in store.events(runner.run_id) if e.kind == "stopped"]
    assert result.status == "stopped" and stopped, [e.kind for e in store.events(runner.run_id)]
    line = stopped[0].message
    assert "nothing had failed" not in line and "http_4xx" in line and said in line, line


def test_a_ramp_whose_requests_never_came_back_claims_no_ceiling(tmp_path):
    import time

    b = StubBehaviour()
    store = open_store(str(tmp_path / "s.db"))

    async def go():
        async with StubServer(b) as srv:
            plan = parse_plan(
                {
                    "name": "silent-ramp",
                    "rounds": 1,
                    "baseline_s": 0.8,
                    "target": {
                        "kind": "command",
                        "environment": "test",
                        "engine": "vllm",
                        "base_url": srv.url,
                        "model": "tiny",
                        "commands": {"status": "true"},
                    },
                    "load": {"concurrency": 2, "prompt_tokens": 8, "max_tokens": 4, "request_timeout_s": 30},
                    "ramp": {
                        "knob": "concurrency",
                        "mode": "geometric",
                        "start": 2,
                        "factor": 2,
                        "ceiling": 4,
                        "step_s": 1.0,
                    },
                    "stop": {"error_rate": 0.5, "window_s": 1.0, "min_requests": 3, "wall_clock_s": 6},
                }
            )
            runner = DrillKind(plan, store, workdir=str(tmp_path / "work"))

            def on_event(ev) -> None:
                if ev.kind == "phase_end" and ev.message == "baseline":
                    b.stall_until = time.monotonic() + 3600  # from here on nothing answers

            return runner, await asyncio.wait_for(run_drill_kind(runner, store, subscribers=[on_event]), 40)

    runner, result = asyncio.run(go())
    events = store.events(runner.run_id)
    kinds = [e.kind for e in events]
    assert "ceiling" not in kinds, [e.message for e in events if e.kind == "ceiling"]
    line = next(e.message for e in events if e.kind == "stopped")
    # each ramp request is given its own timeout (30 s) to end as what it is; the drill's clock runs out first
    assert "stopped by the wall clock during concurrency = 2" in line, line
    assert "no request of the step had ended yet" in line and "last completed step: none" in line, line
    assert result.status == "stopped" and "wall clock" in (
        result.stop_reason or ""
    )  # `vramlab drill` exits 1
    assert "held at the ceiling" not in summary_line(load_context(store, runner.run_id))
