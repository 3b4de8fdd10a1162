"""`vramlab run` as a user runs it: the installed command in a subprocess, a loopback server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.store import open_store

VRAMLAB = [sys.executable, "-m", "vramlab"]


@pytest.fixture()
def server() -> Iterator[tuple[str, StubBehaviour]]:
    """The stub in a thread with its own loop, so a child process can load it."""
    b = StubBehaviour(ttft_s=0.002)
    ready = threading.Event()
    box: dict[str, object] = {}

    def serve() -> None:
        async def main() -> None:
            async with StubServer(b) as srv:
                box["url"] = srv.url
                box["stop"] = stop = asyncio.Event()
                box["loop"] = asyncio.get_running_loop()
                ready.set()
                await stop.wait()

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    yield str(box["url"]), b
    box["loop"].call_soon_threadsafe(box["stop"].set)  # type: ignore[attr-defined]
    t.join(5)


def _plan(tmp_path: Path, url: str, extra: str = "", duration: float = 0.2) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(f"""\
name: cli
target:
  base_url: {url}
  model: stub-model
fixed:
  input:
    synthetic: {{prompt_tokens: 8, output_tokens: 2, seed: 1, count: 4}}
change:
  variable: concurrency
  steps: [2]
phases:
  duration_s: {duration}
  drain_s: 0.5
samplers:
  interval_s: 0.1
  sources: [host, health]
{extra}""")
    return p


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VRAMLAB, "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_completed_run_json_summary(tmp_path: Path, server: tuple[str, StubBehaviour]) -> None:
    url, _ = server
    db = tmp_path / "v.db"
    p = _run(str(_plan(tmp_path, url)), "--db", str(db), "--rounds", "1", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["status"] == "completed" and out["requests"] > 5 and out["errors"] == 0
    assert "round 1/1 treatment step 1" in p.stderr  # progress goes to stderr with --json
    with open_store(str(db)) as store:
        run = store.get_run(out["run_id"])
        assert run.status == "completed"
        assert any("rounds: 1 (from --rounds)" in n for n in run.notes)


def test_bad_plan_is_one_line_exit_2(tmp_path: Path, server: tuple[str, StubBehaviour]) -> None:
    url, _ = server
    plan = _plan(tmp_path, url, "rounds: many\n")
    p = _run(str(plan), "--db", str(tmp_path / "v.db"))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vramlab run: error: {plan}:17: rounds: ")


def test_production_and_missing_key_are_refused(tmp_path: Path, server: tuple[str, StubBehaviour]) -> None:
    url, _ = server
    plan = (
        _plan(tmp_path, url)
        .read_text()
        .replace("  model: stub-model\n", "  model: stub-model\n  environment: production\n")
    )
    (tmp_path / "prod.yaml").write_text(plan)
    p = _run(str(tmp_path / "prod.yaml"), "--db", str(tmp_path / "v.db"))
    assert p.returncode == 2 and "--i-understand-this-is-production" in p.stderr
    keyed = (
        _plan(tmp_path, url)
        .read_text()
        .replace("  model: stub-model\n", "  model: stub-model\n  api_key_env: VRAMLAB_TEST_KEY_X\n")
    )
    (tmp_path / "key.yaml").write_text(keyed)
    p = _run(str(tmp_path / "key.yaml"), "--db", str(tmp_path / "v.db"), env={"VRAMLAB_TEST_KEY_X": ""})
    assert p.returncode == 2 and "VRAMLAB_TEST_KEY_X is not set" in p.stderr


def test_wrong_api_key_stops_by_error_rate_and_never_stores_the_key(
    tmp_path: Path, server: tuple[str, StubBehaviour]
) -> None:
    url, b = server
    b.api_key = "right-key"
    text = _plan(
        tmp_path, url, "stop_conditions: {error_rate: 0.5, min_requests: 5}\n", duration=2
    ).read_text()
    (tmp_path / "k.yaml").write_text(
        text.replace("  model: stub-model\n", "  model: stub-model\n  api_key_env: VRAMLAB_TEST_KEY_Y\n")
    )
    db = tmp_path / "v.db"
    p = _run(
        str(tmp_path / "k.yaml"), "--db", str(db), "--json", env={"VRAMLAB_TEST_KEY_Y": "wrong-secret-key"}
    )
    assert p.returncode == 3, p.stderr
    out = json.loads(p.stdout)
    assert out["stop_condition"] == "error_rate"
    assert any("refused the API key" in n for n in out["notes"])
    assert b"wrong-secret-key" not in db.read_bytes() and "wrong-secret-key" not in p.stdout + p.stderr


def test_sigint_runs_rollbacks_and_marks_the_run_interrupted(
    tmp_path: Path, server: tuple[str, StubBehaviour]
) -> None:
    url, _ = server
    marker = tmp_path / "rolled"
    db = tmp_path / "v.db"
    plan = _plan(
        tmp_path, url, f"rollback: ['echo $VRAMLAB_RUN_STATUS > {marker}']\nrounds: 50\n", duration=0.3
    )
    proc = subprocess.Popen(
        [*VRAMLAB, "run", str(plan), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Wait for the first finished window on the progress output, then press Ctrl-C.
        assert proc.stdout is not None
        for line in proc.stdout:
            if "round 1/50 baseline:" in line:
                break
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert marker.read_text().strip() == "interrupted"
    assert "Traceback" not in err and "interrupted" in out
    with open_store(str(db)) as store:
        run = store.list_runs()[0]
        assert run.status == "interrupted" and run.ended_at is not None
        reqs = store.requests(run.run_id)
        assert len(reqs) > 3 and {r.phase for r in reqs} >= {"baseline"}
        assert [e.kind for e in store.events(run.run_id)][-1] == "run_end"


def test_sigkill_leaves_a_partial_run_that_can_be_reported(
    tmp_path: Path, server: tuple[str, StubBehaviour]
) -> None:
    url, _ = server
    db = tmp_path / "v.db"
    plan = _plan(tmp_path, url, "rounds: 50\n", duration=0.3)
    proc = subprocess.Popen(
        [*VRAMLAB, "run", str(plan), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "round 1/50 treatment step 1:" in line:
                break
        time.sleep(0.7)  # more than one flush interval
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    with open_store(str(db)) as store:
        run = store.list_runs()[0]
        assert run.status == "running" and run.ended_at is None
        phases = {r.phase for r in store.requests(run.run_id)}
        assert {"baseline", "treatment"} <= phases  # the last second at most is lost
    p = subprocess.run(
        [*VRAMLAB, "report", run.run_id, "--db", str(db), "--format", "md"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert run.run_id in p.stdout
