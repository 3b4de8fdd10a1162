"""The simulated card under several processes, a SIGKILLed one, and over-allocation."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from multiprocessing.synchronize import Event as MpEvent

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlab.errors import ConfigError
from vramlab.sim.ledger import DeviceLedger, SimOutOfMemory
from vramlab.units import GIB


def _worker(path: str, n: int, nbytes: int, out: mp.Queue, go: MpEvent) -> None:
    dev = DeviceLedger(path)
    ok = oom = 0
    handles = []
    for i in range(n):
        try:
            handles.append(dev.allocate(nbytes, "activation", f"w{os.getpid()}"))
            ok += 1
        except SimOutOfMemory:
            oom += 1
        if i % 3 == 2 and handles:
            dev.release(handles.pop())
    out.put((os.getpid(), ok, oom, len(handles)))
    go.wait(30)  # stay alive (holding memory) until the parent has checked the books


def test_concurrent_processes_never_overcommit(tmp_path):
    path = str(tmp_path / "gpu0.ledger")
    dev = DeviceLedger(path, gpu="l4")  # 22.49 GiB
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_worker, args=(path, 40, GIB, out, go)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=30) for _ in procs]
    # No lost update: the card's books equal what each live worker says it holds.
    assert dev.memory_info()[1] == sum(r[3] for r in results) * GIB <= dev.total_bytes
    assert sorted(pid for pid, _, _ in dev.processes()) == sorted(r[0] for r in results if r[3])
    assert sum(r[2] for r in results) > 0, "22 GiB cannot hold 4 x ~27 net 1 GiB allocations: some must fail"
    go.set()
    for p in procs:
        p.join(timeout=30)
    # Every worker has exited: the driver gives their memory back.
    total, used, free = dev.memory_info()
    assert (total, used, free) == (dev.total_bytes, 0, dev.total_bytes)
    assert dev.processes() == []


def test_allocations_are_per_process_and_sum_to_used(tmp_path):
    dev = DeviceLedger(tmp_path / "g.ledger", gpu="h100-80gb")
    a = dev.allocate(10 * GIB, "weights", "engine")
    dev.allocate(2 * GIB, "kv_cache", "engine")
    total, used, free = dev.memory_info(0)
    assert used == 12 * GIB and free == total - used and total == dev.total_bytes
    assert dev.processes(0) == [(os.getpid(), 12 * GIB, "engine")]
    dev.release(a)
    assert dev.memory_info()[1] == 2 * GIB
    assert dev.device_count() == 1 and "H100" in dev.name(0)
    with pytest.raises(IndexError):
        dev.memory_info(1)


def test_over_allocation_fails_like_cudamalloc(tmp_path):
    dev = DeviceLedger(tmp_path / "g.ledger", gpu="t4")
    dev.allocate(10 * GIB, "weights")
    with pytest.raises(SimOutOfMemory) as exc:
        dev.allocate(5 * GIB, "kv_cache")
    assert exc.value.requested_bytes == 5 * GIB
    assert exc.value.free_bytes == dev.total_bytes - 10 * GIB
    assert "CUDA out of memory. Tried to allocate 5120.00 MiB" in str(exc.value)
    assert dev.memory_info()[1] == 10 * GIB  # the failed allocation took nothing


def test_sigkilled_process_memory_is_released(tmp_path):
    path = tmp_path / "g.ledger"
    dev = DeviceLedger(path, gpu="a100-80gb")
    code = (
        f"from vramlab.sim.ledger import DeviceLedger; from vramlab.units import GIB; d = DeviceLedger({str(path)!r}); "
        "d.allocate(30 * GIB, 'balloon', 'victim'); print('held', flush=True); import time; time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert dev.processes() == [(proc.pid, 30 * GIB, "victim")]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while dev.memory_info()[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dev.memory_info()[1] == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_wrong_card_and_junk_file_are_user_errors(tmp_path):
    DeviceLedger(tmp_path / "g.ledger", gpu="l4")
    with pytest.raises(ConfigError, match="simulates a l4"):
        DeviceLedger(tmp_path / "g.ledger", gpu="h100")
    junk = tmp_path / "junk.ledger"
    junk.write_text("not json{")
    with pytest.raises(ConfigError, match="not a vramlab device ledger"):
        DeviceLedger(junk)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=30)), max_size=25))
def test_used_never_exceeds_total_and_matches_holdings(tmp_path_factory, ops):
    dev = DeviceLedger(tmp_path_factory.mktemp("h") / "g.ledger", gpu="l4")
    held: dict[int, int] = {}
    for alloc, gib in ops:
        if alloc or not held:
            try:
                held[dev.allocate(gib * GIB, "other")] = gib * GIB
            except SimOutOfMemory:
                assert sum(held.values()) + gib * GIB > dev.total_bytes
        else:
            handle = next(iter(held))
            dev.release(handle)
            del held[handle]
        total, used, free = dev.memory_info()
        assert used == sum(held.values()) <= total and free == total - used


def test_reading_a_missing_device_does_not_create_it(tmp_path):
    with pytest.raises(ConfigError, match="no simulated device at"):
        DeviceLedger(tmp_path / "none.ledger")
    assert not (tmp_path / "none.ledger").exists()
