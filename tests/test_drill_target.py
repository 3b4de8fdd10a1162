"""Target control with real subprocesses (timeouts included) and the environment gate."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vramlab.drill.local_targets import ProcessTarget
from vramlab.drill.plan import parse_plan
from vramlab.drill.ramp import RampSpec, RampSteps, ramp_values
from vramlab.drill.target import (
    OVERRIDE_FLAG,
    CommandTarget,
    TargetCommandError,
    TargetSpec,
    check_environment,
    render,
    run_command,
)
from vramlab.errors import ConfigError, VramlabError
from vramlab.run.steps import StepOutcome

ROOT = Path(__file__).resolve().parents[1]


def test_run_command_success_failure_and_output():
    ok = run_command("echo hi; exit 0", 5)
    assert ok.ok and ok.output.strip() == "hi"
    bad = run_command("echo oops >&2; exit 3", 5)
    assert bad.exit_code == 3 and "oops" in bad.output


def test_run_command_timeout_kills_the_whole_group(tmp_path):
    marker = tmp_path / "grandchild-survived"
    t = time.monotonic()
    with pytest.raises(TargetCommandError, match="overran its 0.5 s timeout"):
        # the grandchild would write the marker after 1.5 s if it outlived the timeout
        run_command(f"(sleep 1.5; touch {marker}) & sleep 30", 0.5)
    assert time.monotonic() - t < 5
    time.sleep(2.0)
    assert not marker.exists()


def test_templates_quote_values_against_injection():
    cmd = render("systemctl restart {unit}", {"unit": "x; touch /tmp/pwned"})
    assert cmd == "systemctl restart 'x; touch /tmp/pwned'"
    with pytest.raises(ConfigError, match="does not set"):
        render("docker restart {container}", {})


@pytest.mark.parametrize(
    "kind,field,value,expect",
    [
        ("systemd", "unit", "vllm.service", "systemctl restart vllm.service"),
        ("docker", "container", "vllm", "docker restart vllm"),
        ("kubectl", "resource", "deployment/vllm", "kubectl -n default rollout restart deployment/vllm"),
    ],
)
def test_ready_made_forms(kind, field, value, expect):
    spec = TargetSpec(kind=kind, environment="test", base_url="http://127.0.0.1:1", **{field: value})
    target = CommandTarget(spec)
    assert render(spec.templates()["restart"], target._values()) == expect
    assert spec.templates()["status"] and spec.templates()["logs"]


def test_command_target_runs_user_templates(tmp_path):
    state = tmp_path / "running"
    log = tmp_path / "target.log"
    spec = TargetSpec(
        kind="command",
        environment="test",
        base_url="http://127.0.0.1:1",
        log_file=str(log),
        commands={
            "start": f"touch {state}; echo started >> {log}",
            "stop": f"rm -f {state}; echo stopped >> {log}",
            "status": f"test -f {state}",
            "logs": "true",
        },
        timeouts_s={"start": 5},
    )
    t = CommandTarget(spec)
    assert not t.status().running
    t.start()
    assert t.status().running
    t.restart()  # no restart template: stop, then start
    assert t.status().running
    assert t.logs(0) == ["started", "stopped", "started"]
    assert t.logs(0) == []  # only new lines
    t.stop()
    assert not t.status().running
    failing = CommandTarget(spec.model_copy(update={"commands": {"start": "exit 7"}}))
    with pytest.raises(TargetCommandError, match="exit 7"):
        failing.start()
    slow = CommandTarget(
        spec.model_copy(update={"commands": {"start": "sleep 10"}, "timeouts_s": {"start": 0.3}})
    )
    with pytest.raises(TargetCommandError, match="timeout"):
        slow.start()


def test_process_target_start_status_logs_stop(tmp_path):
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    spec = TargetSpec(
        kind="process",
        environment="test",
        base_url="http://127.0.0.1:9",
        command=f'{sys.executable} -c "{code}"',
        timeouts_s={"stop": 0.5},
    )
    t = ProcessTarget(spec, tmp_path)
    t.start()
    deadline = time.monotonic() + 5
    lines: list[str] = []
    while time.monotonic() < deadline and not lines:
        lines = t.logs(0)
        time.sleep(0.05)
    assert lines == ["ready"] and t.status().running
    t0 = time.monotonic()
    t.stop()  # ignores SIGTERM: killed after the stop timeout
    assert time.monotonic() - t0 < 5
    st = t.status()
    assert not st.running and st.exit_code is not None


def _plan_doc(environment: str) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "oom-drill.yaml").read_text())
    doc["target"]["environment"] = environment
    return doc


def test_environment_gate():
    plan = parse_plan(_plan_doc("production"))
    with pytest.raises(VramlabError, match=OVERRIDE_FLAG):
        check_environment(plan.target, override=False)
    warning = check_environment(plan.target, override=True)
    assert warning and "production" in warning
    assert check_environment(parse_plan(_plan_doc("test")).target, override=False) is None


def test_cli_flag_is_the_library_flag_and_help_stays_light():
    from vramlab.cli import drill as cli_drill

    assert cli_drill.OVERRIDE_FLAG == OVERRIDE_FLAG
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, argparse; from vramlab.cli import drill, note, alerts; "
            "[m.add_arguments(argparse.ArgumentParser()) for m in (drill, note, alerts)]; "
            "print(sorted(m for m in ('pydantic', 'aiohttp', 'sqlalchemy') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_cli_refuses_non_test_target_in_one_line_and_touches_nothing(tmp_path):
    plan = tmp_path / "prod.yaml"
    plan.write_text(yaml.safe_dump(_plan_doc("staging")))
    db = tmp_path / "store.db"
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "drill", str(plan), "--db", str(db)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**os.environ, "VRAMLAB_DB": str(db)},
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1
    assert OVERRIDE_FLAG in res.stderr and "staging" in res.stderr
    assert not db.exists()  # refused before the store (or the target) was touched


def test_ramp_steps_walk_the_ramp_as_the_runner_walks_its_steps():
    """RampSteps is the drill's StepStrategy: first() then next(outcome of 1-based step i) up to the ceiling."""
    steps = RampSteps(RampSpec(knob="concurrency", start=2, factor=3, ceiling=20))
    seen, v, i = [], steps.first(), 0
    while v is not None:
        seen.append(v)
        i += 1
        v = steps.next(StepOutcome(i, v, 10, 0, None, None))
    assert seen == [2, 6, 18, 20]


def test_ramp_values_geometric_linear_and_ceiling():
    assert ramp_values(RampSpec(knob="context", start=1024, factor=2, ceiling=8192)) == [
        1024,
        2048,
        4096,
        8192,
    ]
    assert ramp_values(RampSpec(knob="context", start=1000, factor=3, ceiling=5000)) == [1000, 3000, 5000]
    assert ramp_values(RampSpec(knob="balloon", mode="linear", start=0.5, step=0.5, ceiling=1.75)) == [
        0.5,
        1.0,
        1.5,
        1.75,
    ]
    with pytest.raises(ValueError, match="factor"):
        RampSpec(start=1, factor=1.0, ceiling=2)
    with pytest.raises(ValueError, match="more than"):
        RampSpec(start=1, factor=1.0001, ceiling=1e9)


def test_plan_errors_are_one_line():
    doc = _plan_doc("test")
    doc["recovery"] = {"mode": "scripted"}
    with pytest.raises(ConfigError, match=r"recovery: .*needs recovery.command"):
        parse_plan(doc)
    doc = _plan_doc("test")
    doc["stop_conditions"]["error_rat"] = 0.3
    with pytest.raises(ConfigError, match=r"stop_conditions.error_rat"):
        parse_plan(doc)


# -- stop that works on any process ---------------------------------------------------------------


def _process(tmp_path: Path, command: str, **spec: object) -> ProcessTarget:
    t = ProcessTarget(
        TargetSpec(
            kind="process",
            environment="test",
            base_url="http://127.0.0.1:9",
            command=command,
            **spec,  # type: ignore[arg-type]
        ),
        tmp_path,
    )
    t.start()
    return t


def test_a_stopped_process_is_killed_at_once_not_after_the_grace(tmp_path):
    import signal

    from vramlab.drill.local_targets import group_stopped

    t = _process(tmp_path, "exec sleep 60", timeouts_s={"stop": 30})
    try:
        time.sleep(0.2)
        assert not group_stopped(t._proc.pid)  # type: ignore[union-attr]
        os.kill(t._proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        time.sleep(0.1)
        assert group_stopped(t._proc.pid)  # type: ignore[union-attr]
        began = time.monotonic()
        t.stop()
        took, how = time.monotonic() - began, t.last_stop
    finally:
        t.close()
    assert took < 2.0, took  # not the 30 s SIGTERM grace: a stopped process never acts on SIGTERM
    assert t._proc is not None and t._proc.returncode == -signal.SIGKILL
    assert how is not None and "SIGKILL at once" in how and "state T" in how


def test_sigterm_escalates_to_sigkill_after_the_stated_grace(tmp_path):
    from vramlab.drill.local_targets import STOP_GRACE_S

    # a child that ignores SIGTERM (the shell traps it; `sleep` is its own child in the group)
    t = _process(tmp_path, "trap '' TERM; while true; do sleep 0.1; done", timeouts_s={"stop": 0.5})
    try:
        time.sleep(0.3)
        began = time.monotonic()
        t.stop()
        took, how = time.monotonic() - began, t.last_stop
    finally:
        t.close()
    assert 0.4 < took < 3.0, took
    assert how == "SIGTERM, then SIGKILL after 0.5 s without an exit"
    # without timeouts_s.stop the grace is the stated default, not the 60 s command timeout
    plain = ProcessTarget(
        TargetSpec(kind="process", environment="test", base_url="http://127.0.0.1:9", command="true"),
        tmp_path,
    )
    assert plain.stop_grace_s() == STOP_GRACE_S <= 5.0 < plain.spec.timeout_s


def test_a_restart_that_failed_is_not_credited_as_mitigation():
    import asyncio

    from vramlab.drill.recovery import LiveState, recover
    from vramlab.plandoc import RecoverySpec

    class Refuses:
        last_stop = None

        def restart(self) -> None:
            raise TargetCommandError("target restart failed (exit 1): no such unit")

    events: list[tuple[str, str]] = []
    state = LiveState(failed_at_s=0.0, running=False)

    async def go():
        t0 = asyncio.get_running_loop().time()
        return await recover(
            RecoverySpec(mode="auto", limit_s=0.6, restart_delay_s=0.0),
            Refuses(),
            state,
            lambda: asyncio.get_running_loop().time() - t0,
            lambda d: events.append((d.kind, d.message)),
        )

    out = asyncio.run(go())
    assert not out.recovered and out.mitigations == 0
    assert not any(k == "mitigation" for k, _ in events), events
    assert any(k == "warning" and "restart failed" in m for k, m in events)


def test_a_start_up_crash_is_reported_as_a_process_exit_with_the_logs_last_lines(tmp_path):
    # the engine exits 1.x s after it was started (a model path that does not exist): the drill says the
    # process exited, with its last words, not "did not pass a health check within 60 s"
    crash = (
        f"{sys.executable} -c \"import time; print('INFO loading model', flush=True); time.sleep(1.2); "
        "raise ValueError('Model path does not exist: /models/nope')\""
    )
    plan = {
        "name": "crash-at-start",
        "rounds": 1,
        "baseline_s": 1.0,
        "target": {
            "kind": "process",
            "environment": "test",
            "engine": "llama.cpp",
            "base_url": "http://127.0.0.1:9",
            "model": "tiny",
            "command": crash,
            "log_file": str(tmp_path / "target.log"),
        },
        "ramp": {
            "knob": "concurrency",
            "mode": "geometric",
            "start": 2,
            "factor": 2,
            "ceiling": 4,
            "step_s": 1,
        },
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(plan))
    t = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "drill", "p.yaml", "--db", str(tmp_path / "v.db"), "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    took = time.monotonic() - t
    assert res.returncode == 1, (res.stdout[-1000:], res.stderr[-2000:])
    assert "the target process exited with code 1" in res.stderr and "after it was started" in res.stderr
    assert "ValueError: Model path does not exist: /models/nope" in res.stderr  # its log's last lines, quoted
    assert (
        "did not pass a health check" not in res.stderr
        and "Traceback (most recent call last)" not in res.stderr.split("its log ends")[0]
    )
    assert took < 30, took  # not the 30-60 s health allowance
