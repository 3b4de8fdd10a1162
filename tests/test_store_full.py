"""A store that fills up or struggles mid-run: the run stops, rolls back, exits non-zero and says
exactly what was kept; the load's latencies do not pay for the writer; a killed run shows as died."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

from vramlab.load.stub import StubBehaviour, StubServer

VRAMLAB = [sys.executable, "-m", "vramlab"]


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose store refuses rows writes them to vramlab-unsaved-RUNID.jsonl in the working folder."""
    monkeypatch.chdir(tmp_path)


def _plan(
    path: Path,
    url: str,
    requests: int = 1_000_000,
    duration: float = 10,
    marker: Path | None = None,
    concurrency: int = 8,
) -> Path:
    rollback = f"rollback:\n  - touch {marker}\n" if marker else ""
    path.write_text(f"""\
name: fill
target: {{base_url: "{url}", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 2, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: [{concurrency}]}}
phases: {{requests: {requests}, duration_s: {duration}, drain_s: 0.5}}
rounds: 1
stop_conditions: {{wall_clock_s: 120}}
samplers: {{interval_s: 0.2, sources: [host]}}
{rollback}""")
    return path


def _count(db: Path, run_id: str) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT count(*) FROM requests WHERE run_id = ?", (run_id,)).fetchone()[0])
    finally:
        con.close()


def _check_failed_run(res: subprocess.CompletedProcess[str], db: Path, marker: Path) -> dict:
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    summary = json.loads(res.stdout)
    assert summary["status"] == "failed" and summary["store_complete"] is False
    assert "store" in (summary["store_failure"] or "") and "full" in summary["store_failure"]
    received, stored = summary["received"], summary["stored"]
    assert stored["requests"] < received["requests"]  # what was lost is counted, not hidden
    assert stored["requests"] == _count(db, summary["run_id"])  # and the count is what the store holds
    assert f"the store holds {stored['requests']} of {received['requests']} requests" in res.stderr
    assert (
        summary["elapsed_s"] < 25
    )  # three 10 s windows planned: the load stopped instead of running on unrecorded
    assert marker.exists()  # the rollbacks ran
    return summary


def _can_mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    where.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )


def test_run_on_a_filesystem_that_fills_up(tmp_path: Path, stub: str) -> None:
    """The real thing: SQLite on a 2 MiB tmpfs, filled up but for a little room."""
    mnt = tmp_path / "mnt"
    if not _can_mount_tmpfs(mnt):
        pytest.skip("cannot mount a tmpfs here (needs root); the max_page_count test covers the path")
    try:
        db = mnt / "v.db"
        assert subprocess.run([*VRAMLAB, "runs", "--db", str(db)], capture_output=True).returncode == 0
        free = shutil.disk_usage(mnt).free
        (mnt / "filler").write_bytes(b"\0" * max(0, free - 160 * 1024))  # leave ~160 KiB
        marker = tmp_path / "rolled-back"
        t = time.monotonic()
        res = subprocess.run(
            [
                *VRAMLAB,
                "run",
                str(_plan(tmp_path / "p.yaml", stub, marker=marker)),
                "--db",
                str(db),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        summary = _check_failed_run(res, db, marker)
        assert time.monotonic() - t < 90
        (mnt / "filler").unlink()  # room again: the report reads what was kept, and says so
        rep = subprocess.run(
            [*VRAMLAB, "report", summary["run_id"], "--db", str(db), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert rep.returncode == 0, rep.stderr
        runs = json.loads(
            subprocess.run(
                [*VRAMLAB, "runs", "--json", "--db", str(db)], capture_output=True, text=True, timeout=60
            ).stdout
        )
        assert runs[0]["status"] in ("failed", "died")  # never "completed", never "running"
        print(f"runs shows: {runs[0]['status']}")
        print(f"full tmpfs: {json.dumps({k: summary[k] for k in ('received', 'stored', 'store_failure')})}")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _page_limited_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SQLite store that has room for 40 more pages: SQLite's own 'database or disk is full'."""
    from vramlab.store import open_store, sql

    db = tmp_path / "v.db"
    open_store(str(db)).close()
    con = sqlite3.connect(db)
    pages = con.execute("PRAGMA page_count").fetchone()[0]
    con.close()
    real = sql._sqlite_pragmas

    def limited(dbapi_conn, record):
        real(dbapi_conn, record)
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages + 40}")

    monkeypatch.setattr(sql, "_sqlite_pragmas", limited)
    return db


def test_run_on_a_store_at_its_page_limit(tmp_path: Path, stub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's own 'database or disk is full' (max_page_count), in process: no root needed."""
    from vramlab.experiment.plan import load_plan
    from vramlab.experiment.start import run_plan
    from vramlab.store import open_store

    db = _page_limited_db(tmp_path, monkeypatch)
    marker = tmp_path / "rolled-back"
    plan_path = _plan(tmp_path / "p.yaml", stub, marker=marker)
    out = run_plan(load_plan(plan_path), plan_dir=tmp_path, open_store=lambda: open_store(str(db)))
    assert out.result.status == "failed" and out.result.exit_code == 1
    assert not out.store_complete and out.store_failure and "full" in out.store_failure
    assert out.received and out.stored and out.stored["requests"] < out.received["requests"]
    assert out.stored["requests"] == _count(db, out.result.run_id)
    print("page limit:", out.received, out.stored, f"{out.result.elapsed_s:.1f} s")
    assert out.result.elapsed_s < 25 and marker.exists()  # three 10 s windows planned; the load stopped


class _SlowStore:
    """Every write takes 0.3 s (a disk at its limit, a remote database far away)."""

    def __init__(self, real: object) -> None:
        self.real = real

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.real, name)
        if name.startswith("add_"):

            def slow(*a: object, **k: object) -> object:
                time.sleep(0.3)
                return attr(*a, **k)

            return slow
        return attr


def test_a_slow_store_does_not_slow_the_measured_latencies(tmp_path: Path, stub: str) -> None:
    from vramlab.experiment.kind import ExperimentKind, RunOptions
    from vramlab.experiment.plan import load_plan
    from vramlab.records.store import Store
    from vramlab.run.events import EventHook
    from vramlab.run.recorder import StoreRecorder
    from vramlab.run.runner import Runner
    from vramlab.store import open_store

    # 100 requests a phase: the slow store's 60 writes of 5 rows take 18 s to drain (300 took 54 s)
    plan = load_plan(_plan(tmp_path / "p.yaml", stub, requests=100, duration=60, concurrency=2))

    def p50(slow: bool) -> tuple[float, int]:
        store = open_store(str(tmp_path / f"{slow}.db"))
        # _SlowStore forwards every attribute to the real store: a Store by duck typing, not by class
        rec = StoreRecorder(cast("Store", _SlowStore(store)) if slow else store, flush_s=0.05, batch=5)
        hook = EventHook()
        hook.add(rec, critical=True)
        res = asyncio.run(
            Runner(ExperimentKind(plan, RunOptions(samplers=[], capture_environment=False)), hook).run()
        )
        e2e = sorted(r.e2e_ms for r in store.requests(res.run_id) if r.e2e_ms is not None)
        store.close()
        return e2e[len(e2e) // 2], len(e2e)

    fast, n_fast = p50(False)
    slow, n_slow = p50(True)
    assert n_fast == n_slow == 3 * 100  # baseline, treatment, recovery: nothing lost on the slow store either
    # Written on the event loop, each 0.3 s write would stall every request in flight (P50 ~100x).
    print(f"P50 e2e: {fast:.1f} ms on a normal store, {slow:.1f} ms with 0.3 s writes")
    assert slow < 3 * fast + 20, (fast, slow)


def test_a_killed_run_shows_as_died(tmp_path: Path, stub: str) -> None:
    db = tmp_path / "v.db"
    plan = _plan(tmp_path / "p.yaml", stub, requests=1_000_000, duration=60, concurrency=1)
    proc = subprocess.Popen(
        [*VRAMLAB, "run", str(plan), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.3)
            rows = (
                json.loads(
                    subprocess.run(
                        [*VRAMLAB, "runs", "--json", "--db", str(db)], capture_output=True, text=True
                    ).stdout
                    or "[]"
                )
                if db.exists()
                else []
            )
            # killed once the writer has beaten and stored some answered requests (the first
            # heartbeat can come before the first batch of rows)
            if rows and rows[0]["heartbeat_at"] is not None and _count(db, rows[0]["id"]) > 0:
                break
        assert rows and rows[0]["status"] == "running", rows
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    rows = json.loads(
        subprocess.run([*VRAMLAB, "runs", "--json", "--db", str(db)], capture_output=True, text=True).stdout
    )
    assert rows[0]["stored_status"] == "running" and rows[0]["status"] == "died"
    # killed inside a 60 s window: what was stored before the kill is still there
    assert _count(db, rows[0]["id"]) > 0
    table = subprocess.run([*VRAMLAB, "runs", "--db", str(db)], capture_output=True, text=True).stdout
    assert f"{rows[0]['id']}  run   died" in table


def test_observed_status_from_a_stale_heartbeat() -> None:
    from vramlab.store.liveness import STALE_S, observed_status

    now = 1_000_000.0
    assert observed_status("completed", 0, None, None, None, now) == "completed"
    assert observed_status("running", now - 5, now - 1, None, "elsewhere", now) == "running"
    assert observed_status("running", now - 500, now - STALE_S - 1, 12345, "another-host", now) == "died"
    assert observed_status("running", now - 500, None, None, None, now) == "died"
    assert (
        observed_status("running", now - 1, now - 1, os.getpid(), __import__("socket").gethostname(), now)
        == "running"
    )


def test_a_drill_stops_its_load_when_the_store_refuses_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drill, like the run, stops the load as soon as the writer gives up (not at the end of its
    ramp), rolls back, and says it was not stored completely."""
    from vramlab.drill.kind import DrillKind
    from vramlab.drill.plan import parse_plan
    from vramlab.drill.start import run_drill_kind
    from vramlab.store import open_store

    db = _page_limited_db(tmp_path, monkeypatch)
    store = open_store(str(db))
    planned_s = 0.5 + 6 * 5.0  # baseline + six 5 s steps (2 .. 64)

    async def go() -> tuple[DrillKind, object, float]:
        async with StubServer(StubBehaviour(ttft_s=0.001)) as srv:
            doc = {
                "name": "full",
                "rounds": 1,
                "baseline_s": 0.5,
                "target": {"kind": "command", "environment": "test", "base_url": srv.url, "model": "m"},
                "load": {"concurrency": 2, "prompt_tokens": 8, "max_tokens": 2},
                "ramp": {"knob": "concurrency", "start": 2, "factor": 2, "ceiling": 64, "step_s": 5.0},
                "stop": {"wall_clock_s": 120},
            }
            r = DrillKind(parse_plan(doc), store, workdir=str(tmp_path / "w"))
            t = time.monotonic()
            res = await asyncio.wait_for(run_drill_kind(r, store), 90)
            return r, res, time.monotonic() - t

    runner, res, elapsed = asyncio.run(go())
    assert res.status == "failed" and "full" in (res.stop_reason or ""), res  # type: ignore[attr-defined]
    session = res.session  # type: ignore[attr-defined]
    assert not session.store_complete and session.store_failure and "full" in session.store_failure
    print(
        f"drill on a full store: stopped after {elapsed:.1f} s of {planned_s:.0f} s planned; {session.stored_line()}"
    )
    assert elapsed < planned_s * 0.75  # stopped when the writer gave up, not at the end of the ramp
