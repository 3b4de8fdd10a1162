"""A second process opening and closing the store must not cost a running writer its commits.

Closing any descriptor of a file drops every POSIX (fcntl) lock the process holds on it, SQLite's
included; when the schema lock was taken on the database file itself, a short-lived `vramlab note`
could see itself as the last connection, checkpoint and delete the WAL under a running drill, and
the drill's later commits vanished when it was killed (SQLite "How To Corrupt", section 2.2).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WRITER = r"""
import sys, time
from vramlab.store import open_store
from vramlab.records import EventRecord, RunRecord
store = open_store(sys.argv[1])
store.create_run(RunRecord(run_id="abcd1234", kind="drill", name="w", plan={}, plan_hash="x", fixed={}, target={},
                           change={}, started_at=time.time(), status="running"))
for i in range(1000):
    store.add_events("abcd1234", [EventRecord(run_id="abcd1234", t_s=i * 0.05, kind="step", message=str(i))])
    print(i, flush=True)
    time.sleep(0.05)
"""


def test_a_short_lived_second_process_does_not_lose_the_writers_commits(tmp_path: Path):
    db = tmp_path / "store.db"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        for _ in range(10):  # let it commit for a while
            writer.stdout.readline()
        vramlab = str(Path(sys.executable).parent / "vramlab")
        note = subprocess.run(
            [vramlab, "note", "abcd1234", "restarted the engine", "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert note.returncode == 0, note.stderr
        committed = -1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = writer.stdout.readline()
            committed = int(line)
            if committed >= 30:
                break
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    from vramlab.store import open_store

    store = open_store(str(db))
    steps = [e for e in store.events("abcd1234") if e.kind == "step"]
    assert len(steps) >= committed + 1, f"{committed + 1} events committed, {len(steps)} survived"
