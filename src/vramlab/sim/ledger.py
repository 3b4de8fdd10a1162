"""The simulated card: a small JSON file, locked with fcntl, recording who holds how much memory.

Several sim processes (and balloons) share one card by sharing one file. Every read drops the
allocations of processes that are gone (a pid that no longer exists, or exists with another
start time, i.e. a reused pid), as the driver frees a dead process's memory. Reads answer what
NVML answers, with the same method names the NVML sampler uses, so a sampler can read either.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramlab.errors import ConfigError
from vramlab.units import gib

MIB = 1 << 20
KINDS = ("weights", "kv_cache", "activation", "cuda_graph", "non_torch", "balloon", "other")


class SimOutOfMemory(Exception):
    """cudaMalloc failed: the card has less free memory than asked for."""

    def __init__(self, requested_bytes: int, free_bytes: int, total_bytes: int, device_index: int = 0):
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes
        self.total_bytes = total_bytes
        self.device_index = device_index
        super().__init__(
            f"CUDA out of memory. Tried to allocate {requested_bytes / MIB:.2f} MiB. GPU {device_index} has a "
            f"total capacity of {gib(total_bytes, unit=True)} of which {free_bytes / MIB:.2f} MiB is free."
        )


@dataclass(frozen=True)
class Allocation:
    id: int
    pid: int
    name: str
    kind: str
    bytes: int


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        created: float = psutil.Process(pid).create_time()  # psutil is untyped here
        return created
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _alive(pid: int, start_time: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False  # a killed child not yet reaped holds no GPU memory either
        same: bool = abs(proc.create_time() - start_time) < 0.01
        return same
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class DeviceLedger:
    """One simulated GPU backed by a file. Safe under concurrent processes (exclusive flock)."""

    def __init__(self, path: str | os.PathLike[str], gpu: str | None = None):
        self.path = Path(path)
        self._pid = os.getpid()
        self._start = _start_time(self._pid) or 0.0
        if gpu is None and not self.path.exists():
            raise ConfigError(
                f"no simulated device at {self.path} (`vramlab sim serve` or `sim balloon --gpu` creates one)"
            )
        with self._locked() as state:
            if gpu is not None:
                from vramlab.capacity.gpus import get_gpu

                card = get_gpu(gpu)
                if not state:
                    state.update(gpu=card.name, total_bytes=card.memory_bytes, next_id=1, allocations=[])
                elif state["gpu"] != card.name:
                    raise ConfigError(f"{self.path} simulates a {state['gpu']}, not a {card.name}")
            elif not state:
                raise ConfigError(f"{self.path} is empty: not a simulated device")
            self.gpu = state["gpu"]
            self.total_bytes = int(state["total_bytes"])

    # --- the file -----------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = b""
            while chunk := os.read(fd, 1 << 16):
                raw += chunk
            try:
                state: dict[str, Any] = json.loads(raw) if raw.strip() else {}
            except ValueError as exc:
                raise ConfigError(f"{self.path} is not a vramlab device ledger ({exc})") from None
            before = json.dumps(state, sort_keys=True)
            if state:
                state["allocations"] = [a for a in state["allocations"] if _alive(a["pid"], a["start"])]
            yield state
            after = json.dumps(state, sort_keys=True)
            if after != before:
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, after.encode())
        finally:
            os.close(fd)  # closing drops the flock

    # --- allocation ---------------------------------------------------------------------
    def allocate(self, nbytes: int, kind: str, name: str = "", pid: int | None = None) -> int:
        """Take *nbytes* for this process; raise SimOutOfMemory when they are not free."""
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} not in {KINDS}")
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError("negative allocation")
        with self._locked() as state:
            used = sum(a["bytes"] for a in state["allocations"])
            free = state["total_bytes"] - used
            if nbytes > free:
                raise SimOutOfMemory(nbytes, free, state["total_bytes"])
            handle = int(state["next_id"])
            state["next_id"] = handle + 1
            state["allocations"].append(
                {
                    "id": handle,
                    "pid": pid or self._pid,
                    "start": self._start if pid is None else _start_time(pid),
                    "name": name or f"pid{self._pid}",
                    "kind": kind,
                    "bytes": nbytes,
                }
            )
            return handle

    def release(self, handle: int) -> None:
        with self._locked() as state:
            state["allocations"] = [a for a in state["allocations"] if a["id"] != handle]

    def release_pid(self, pid: int | None = None) -> None:
        """Free everything a process holds (this one by default), as process exit does."""
        pid = pid or self._pid
        with self._locked() as state:
            state["allocations"] = [a for a in state["allocations"] if a["pid"] != pid]

    def allocations(self) -> list[Allocation]:
        with self._locked() as state:
            return [
                Allocation(a["id"], a["pid"], a["name"], a["kind"], a["bytes"]) for a in state["allocations"]
            ]

    # --- what NVML would answer ---------------------------------------------------------
    def device_count(self) -> int:
        return 1

    def name(self, index: int = 0) -> str:
        self._check(index)
        return f"{self.gpu.upper()} (simulated)"

    def memory_info(self, index: int = 0) -> tuple[int, int, int]:
        """(total, used, free) in bytes, like nvmlDeviceGetMemoryInfo."""
        self._check(index)
        with self._locked() as state:
            used = sum(a["bytes"] for a in state["allocations"])
            return state["total_bytes"], used, state["total_bytes"] - used

    def processes(self, index: int = 0) -> list[tuple[int, int, str]]:
        """[(pid, used_bytes, name)] like nvmlDeviceGetComputeRunningProcesses."""
        self._check(index)
        by_pid: dict[int, list[Any]] = {}
        for a in self.allocations():
            entry = by_pid.setdefault(a.pid, [0, a.name])
            entry[0] += a.bytes
        return [(pid, used, name) for pid, (used, name) in sorted(by_pid.items())]

    def _check(self, index: int) -> None:
        if index != 0:
            raise IndexError(f"simulated device {self.path} has one GPU; index {index} is out of range")
