"""SQLite under a live runner: a reader never blocks or sees half a batch; SIGKILL keeps commits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from vramlab.store import open_store
from vramlab.store.migrations import LATEST

BATCH = 200

WRITER = r"""
import sys, time
from vramlab.store import open_store
from vramlab.records import RunRecord, RequestRecord, SampleRecord
url, batches = sys.argv[1], int(sys.argv[2])
store = open_store(url)
store.create_run(RunRecord(run_id="feed0001", name="w", started_at=time.time()))
print("created", flush=True)
i = 0
while batches == 0 or i < batches:
    reqs = [RequestRecord(run_id="feed0001", round=0, phase="ramp", step=i, request_id=f"{i}-{j}",
                          status_code=200, e2e_ms=float(j), itl_ms=[1.0] * 8) for j in range(BATCH)]
    store.add_requests("feed0001", reqs)
    store.add_samples("feed0001", [SampleRecord(run_id="feed0001", t_s=float(i), source="host",
                                                name="host.cpu_percent", value=50.0)])
    print("batch", i, flush=True)
    i += 1
    time.sleep(0.05)
store.update_run("feed0001", status="completed", ended_at=time.time())
print("done", flush=True)
""".replace("BATCH", str(BATCH))


def _writer(url: str, batches: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, str(batches)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "created"
    return proc


def test_reader_sees_whole_batches_while_writer_runs(tmp_path):
    url = str(tmp_path / "live.db")
    proc = _writer(url, 40)
    seen: list[int] = []
    reader = open_store(url)
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            status = reader.get_run("feed").status
            n = len(reader.requests("feed0001"))
            assert n % BATCH == 0, f"reader saw a torn batch: {n} rows"
            seen.append(n)
            if status == "completed":  # read before the count, so the count must be whole
                assert n == 40 * BATCH
        assert proc.wait(timeout=30) == 0
        assert seen == sorted(seen)
        assert len(set(seen)) > 2, "reader never overlapped the writer"
        assert len(reader.requests("feed0001")) == 40 * BATCH
        assert reader.get_run("feed0001").status == "completed"
    finally:
        reader.close()
        if proc.poll() is None:
            proc.kill()


def test_sigkill_keeps_every_committed_batch(tmp_path):
    url = str(tmp_path / "killed.db")
    proc = _writer(url, 0)
    assert proc.stdout is not None
    acknowledged = -1
    while acknowledged < 5:
        line = proc.stdout.readline()
        assert line.startswith("batch"), line
        acknowledged = int(line.split()[1])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with open_store(url) as store:
        run = store.get_run("feed0001")
        assert run.status == "running" and run.ended_at is None  # the report will call it incomplete
        n = len(store.requests("feed0001"))
        assert n % BATCH == 0
        assert n >= (acknowledged + 1) * BATCH
        assert len(store.samples("feed0001", source="host")) >= acknowledged + 1


OPENER = r"""
import sys
from vramlab.store import open_store
open_store(sys.argv[1]).close()
"""


def test_processes_opening_a_fresh_store_at_once(store_url):
    procs = [
        subprocess.Popen([sys.executable, "-c", OPENER, store_url], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    import sqlalchemy as sa

    with open_store(store_url) as store, store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version FROM schema_version")).scalars().all() == list(
            range(1, LATEST + 1)
        )  # each migration once
