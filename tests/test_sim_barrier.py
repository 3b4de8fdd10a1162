"""The start barrier: sims started at once meet before and after their memory snapshot, so the
start-up race (vllm #55827) happens at any --speed; a missing peer cannot hang a start."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from vramlab.sim.barrier import StartBarrier
from vramlab.sim.launch import start_sim
from vramlab.sim.ledger import DeviceLedger

CHAT = [
    "--model",
    "qwen2.5-1.5b-instruct",
    "--gpu",
    "l4",
    "--gpu-memory-utilization",
    "0.2",
    "--max-model-len",
    "4096",
    "--max-num-seqs",
    "4",
    "--speed",
    "200",
    "--watchdog-s",
    "0.5",
]
SMALL = [
    "--model",
    "qwen2.5-0.5b-instruct",
    "--gpu",
    "l4",
    "--gpu-memory-utilization",
    "0.097",
    "--max-model-len",
    "4096",
    "--max-num-seqs",
    "4",
    "--speed",
    "200",
    "--watchdog-s",
    "0.5",
]


def test_parse():
    b = StartBarrier.parse("/tmp/x:y.barrier:3")
    assert (b.path, b.parties) == ("/tmp/x:y.barrier", 3)
    for bad in ("nofile", "f:0", "f:x", ":2"):
        with pytest.raises(ValueError):
            StartBarrier.parse(bad)


def test_waits_for_every_party_and_times_out_alone(tmp_path):
    path = str(tmp_path / "b")

    async def both() -> list[bool]:
        a, b = StartBarrier(path, 2), StartBarrier(path, 2)
        return list(await asyncio.gather(a.wait("snapshot"), b.wait("snapshot")))

    assert asyncio.run(both()) == [True, True]
    t = time.monotonic()
    assert asyncio.run(StartBarrier(str(tmp_path / "c"), 2, timeout_s=0.2).wait("context")) is False
    assert time.monotonic() - t < 2


def test_bad_barrier_is_a_one_line_error():
    out = subprocess.run(
        [sys.executable, "-m", "vramlab", "sim", "serve", "--start-barrier", "nope"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "FILE:N" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.timeout(40)
def test_started_at_once_they_miscount_each_other_and_one_refuses(tmp_path):
    """pack's settings fit one after another; at once, each charges the other's loading to itself."""
    dev, bar = str(tmp_path / "gpu0.ledger"), f"{tmp_path / 'race.barrier'}:2"
    procs = [
        start_sim(
            a + ["--start-barrier", bar], device=dev, wait_ready=False, log_path=str(tmp_path / f"{i}.log")
        )
        for i, a in enumerate((CHAT, SMALL))
    ]
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            logs = [p.log_text() for p in procs]
            done = [p.poll() is not None or "running on" in t for p, t in zip(procs, logs, strict=True)]
            if all(done):
                break
            time.sleep(0.05)
        refused = [p for p in procs if p.poll() is not None]
        assert refused, "both started: the race was not reproduced"
        for p in refused:
            assert p.poll() == 1
            assert "No available memory for the cache blocks" in p.log_text() or "max seq len" in p.log_text()
    finally:
        for p in procs:
            p.stop()
    assert DeviceLedger(dev).memory_info(0)[1] == 0
    # one after another (no barrier), the same settings fit
    a = start_sim(CHAT, device=dev)
    b = start_sim(SMALL, device=dev)
    try:
        assert a.poll() is None and b.poll() is None
    finally:
        b.stop()
        a.stop()
