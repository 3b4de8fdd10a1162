"""The store's file removed, replaced or made read-only under a running writer: the next write
sees it (SQLite would go on writing into a file nobody can read again), and the run stops as on a
full disk: rollbacks, exit 1, the rows counted back from what the path still holds, never "completed"."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from vramlab.run.events import Event


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose store refuses rows writes them to vramlab-unsaved-RUNID.jsonl in the working folder."""
    monkeypatch.chdir(tmp_path)


def _plan(path: Path, url: str, marker: Path) -> Path:
    path.write_text(f"""\
name: faults
target: {{base_url: "{url}", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 2, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: [4]}}
phases: {{requests: 1000000, duration_s: 10, drain_s: 0.5}}
rounds: 1
stop_conditions: {{wall_clock_s: 120}}
samplers: {{interval_s: 0.2, sources: [host]}}
rollback:
  - touch {marker}
""")
    return path


def _requests_in(db: Path, immutable: bool = False) -> int:
    """Rows in the file at *db*; ``immutable``: the file alone, not the ``-wal`` beside it (after a
    replacement that ``-wal`` is the old file's, and SQLite would show its rows over the new file)."""
    con = sqlite3.connect(f"file:{db}?mode=ro" + ("&immutable=1" if immutable else ""), uri=True, timeout=5)
    try:
        return int(con.execute("SELECT count(*) FROM requests").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        con.close()


def _once_stored(db: Path, fault: Callable[[], None]) -> Callable[[Event], None]:
    """A run subscriber that does *fault* once, mid-run: after 300 requests, at the first look (every
    50 requests) that finds the writer has stored some of them."""
    seen, done = [0], [False]

    def sub(ev: Event) -> None:
        if ev.kind == "request" and not done[0]:
            seen[0] += 1
            if seen[0] >= 300 and seen[0] % 50 == 0 and _requests_in(db) > 0:
                done[0] = True
                fault()

    return sub


def _run_with_fault(tmp_path: Path, stub: str, fault: Callable[[Path], None]) -> tuple[object, Path, Path]:
    from vramlab.experiment.plan import load_plan
    from vramlab.experiment.start import run_plan
    from vramlab.store import open_store

    db = tmp_path / "v.db"
    marker = tmp_path / "rolled-back"
    plan = load_plan(_plan(tmp_path / "p.yaml", stub, marker))
    t = time.monotonic()
    out = run_plan(
        plan,
        plan_dir=tmp_path,
        open_store=lambda: open_store(str(db)),
        subscribers=[_once_stored(db, lambda: fault(db))],
    )
    elapsed = time.monotonic() - t
    r = out.result
    print(f"{r.status} after {elapsed:.1f} s; {out.stored_line()}; {out.store_failure}")
    assert r.status == "failed" and r.exit_code == 1  # never completed
    assert elapsed < 25  # three 10 s phases planned: the load stopped at the fault
    assert marker.exists()  # the rollbacks ran
    assert not out.store_complete and out.received and out.received["requests"] >= 300
    return out, db, marker


def test_a_store_file_replaced_mid_run_stops_the_run(tmp_path: Path, stub: str) -> None:
    from vramlab.store import open_store

    other = tmp_path / "other.db"
    open_store(str(other)).close()

    def replace(db: Path) -> None:
        os.replace(other, db)  # an empty store where ours was (a restore, a copy over it)

    out, db, _ = _run_with_fault(tmp_path, stub, replace)
    assert "replaced" in (out.store_failure or "")  # type: ignore[attr-defined]
    # counted back from the file now at the path as a later reader reads it: the other store, with the
    # write-ahead log beside it that SQLite applies (this run's rows written before the swap)
    assert out.stored["requests"] == _requests_in(db) < out.received["requests"]  # type: ignore[attr-defined]
    assert _requests_in(db, immutable=True) == 0  # the other store's own file never had them


def test_a_copy_of_the_store_put_back_mid_run_is_counted_as_it_reads(tmp_path: Path, stub: str) -> None:
    """A copy of the store put in its place (cp, then mv over it) reads with the write-ahead log
    beside it: the count once said 0 while the file showed hundreds of this run's rows."""

    def put_back_a_copy(db: Path) -> None:
        shutil.copyfile(db, db.with_name("copy.db"))
        os.replace(db.with_name("copy.db"), db)

    out, db, _ = _run_with_fault(tmp_path, stub, put_back_a_copy)
    assert "replaced" in (out.store_failure or "")  # type: ignore[attr-defined]
    assert 0 < out.stored["requests"] == _requests_in(db)  # type: ignore[attr-defined]


def test_a_store_file_removed_mid_run_stops_the_run(tmp_path: Path, stub: str) -> None:
    out, db, _ = _run_with_fault(tmp_path, stub, lambda db: db.unlink())
    assert "removed" in (out.store_failure or "")  # type: ignore[attr-defined]
    assert out.stored == {"requests": 0, "samples": 0, "events": 0}  # type: ignore[attr-defined]


def _make_read_only(db: Path) -> Callable[[], None]:
    """Make *db* read-only for this process, for real; returns the undo.

    A user: chmod 0444 (``access(2)`` then refuses writing). Root ignores file modes, so for root
    the file is made immutable (``chattr +i``, FS_IMMUTABLE_FL): the kernel refuses every write to
    it, root's included, through descriptors already open too. Skipped where neither is possible
    (a file system without the flag)."""
    if os.geteuid() != 0:
        db.chmod(0o444)
        return lambda: db.chmod(0o644)
    if not shutil.which("chattr"):
        pytest.skip("root, and no chattr to make the store immutable")
    probe = db.with_name("probe")
    probe.write_bytes(b"")
    ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    if not ok:
        pytest.skip("root, and this file system has no immutable flag: cannot make the store read-only")
    subprocess.run(["chattr", "+i", str(db)], check=True)

    def undo() -> None:
        subprocess.run(["chattr", "-i", str(db)], check=False)

    return undo


def test_a_store_file_made_read_only_mid_run_stops_the_run(tmp_path: Path, stub: str) -> None:
    undo: list[Callable[[], None]] = []
    try:
        out, db, _ = _run_with_fault(tmp_path, stub, lambda db: undo.append(_make_read_only(db)))
        assert undo, "the fault did not happen"
        assert "read-only" in (out.store_failure or "")  # type: ignore[attr-defined]
        stored = out.stored  # type: ignore[attr-defined]
        # the file is still there and readable: what it holds is counted, and it is what it holds
        assert stored is not None and 0 < stored["requests"] < out.received["requests"]  # type: ignore[attr-defined]
        assert stored["requests"] == _requests_in(db)
    finally:
        for u in undo:
            u()


def test_a_shm_made_immutable_mid_run_fails_cleanly_and_keeps_every_row(
    tmp_path: Path, stub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite maps the -shm: one made immutable under the writer killed the process with SIGBUS (a
    read, a close). The check refuses it like a read-only file; the rows the store refused are
    written to a JSON-lines file in the working folder and the result says where."""
    monkeypatch.chdir(tmp_path)
    undo: list[Callable[[], None]] = []
    try:
        out, db, _ = _run_with_fault(
            tmp_path, stub, lambda db: undo.append(_make_read_only(db.with_name(db.name + "-shm")))
        )
        assert undo, "the fault did not happen"
        assert "-shm file became read-only" in (out.store_failure or "")  # type: ignore[attr-defined]
        assert out.stored is None  # type: ignore[attr-defined]  # not a false count
        path, rows = out.spooled  # type: ignore[attr-defined]
        lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
        assert Path(path).parent == tmp_path and lines[0]["run_id"] and len(lines) == rows + 1 > 1
        assert {line["table"] for line in lines[1:]} <= {"requests", "samples", "events"}
        assert f"the {rows} rows it refused are in {path}" in out.stored_line()  # type: ignore[attr-defined]
    finally:
        for u in undo:
            u()


def test_the_cli_exits_1_when_the_store_file_is_removed_mid_run(tmp_path: Path, stub: str) -> None:
    """Through the installed command: removed under the running process, from outside it."""
    db = tmp_path / "v.db"
    marker = tmp_path / "rolled-back"
    plan = _plan(tmp_path / "p.yaml", stub, marker)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.Popen(
        ["vramlab", "run", str(plan), "--db", str(db), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (db.exists() and _requests_in(db) > 0):
            time.sleep(0.2)
        assert _requests_in(db) > 0, "the run stored nothing"
        db.unlink()
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, stdout + stderr
    assert "Traceback" not in stderr
    s = json.loads(stdout)
    assert s["status"] == "failed" and s["store_complete"] is False and "removed" in s["store_failure"]
    assert s["stored"]["requests"] == 0 < s["received"]["requests"]
    assert f"the store holds 0 of {s['received']['requests']} requests" in stderr
    assert s["elapsed_s"] < 25 and marker.exists()


def test_an_untouched_store_is_checked_and_passes(tmp_path: Path) -> None:
    """The check is not a false alarm: an ordinary store (moved nowhere) takes writes and counts as usual."""
    from vramlab.records import RunRecord
    from vramlab.store import open_store

    with open_store(str(tmp_path / "v.db")) as store:
        store.create_run(RunRecord(run_id="abc12345", name="n", started_at=time.time(), status="running"))
        store.heartbeat("abc12345")
        store.update_run("abc12345", status="completed")
        assert store.count("abc12345") == {"requests": 0, "samples": 0, "events": 0}
        assert store.get_run("abc12345").status == "completed"
