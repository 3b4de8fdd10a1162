"""Co-tenants a drill puts next to its target: a memory balloon and co-loaded models.

On the sim the balloon is an allocation on the simulated card's ledger, held by the drill's own
process (so it vanishes if the drill is killed, as a real process's memory does). On a real GPU it
is a child process that allocates with PyTorch or CuPy, whichever is installed. Everything here
is undone by `release()`; the runner calls it in its rollback, on Ctrl-C too.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from vramlab.errors import ConfigError
from vramlab.units import GIB, gib


class Balloon(Protocol):
    held_bytes: int

    def set_bytes(self, nbytes: int) -> None: ...
    def free_bytes(self) -> int | None: ...
    def release(self) -> None: ...


class CotenantOutOfMemory(Exception):
    """The co-tenant itself could not get its memory: the card is full (the target held on)."""


class LedgerBalloon:
    """Memory held on the sim's device ledger. Grows and shrinks in place."""

    def __init__(self, device: str):
        from vramlab.sim.ledger import DeviceLedger

        self.ledger = DeviceLedger(device)
        self._handles: list[tuple[int, int]] = []
        self.held_bytes = 0

    def free_bytes(self) -> int | None:
        return int(self.ledger.memory_info(0)[2])

    def set_bytes(self, nbytes: int) -> None:
        """Hold exactly *nbytes* (raises the ledger's SimOutOfMemory if the card has no room)."""
        from vramlab.sim.ledger import SimOutOfMemory

        while self._handles and self.held_bytes > nbytes:
            h, n = self._handles.pop()
            self.ledger.release(h)
            self.held_bytes -= n
        if nbytes > self.held_bytes:
            extra = nbytes - self.held_bytes
            try:
                h = self.ledger.allocate(extra, "balloon", "vramlab-drill-balloon")
            except SimOutOfMemory as exc:
                raise CotenantOutOfMemory(f"balloon: {exc}") from None
            self._handles.append((h, extra))
            self.held_bytes += extra

    def release(self) -> None:
        self.set_bytes(0)


# The child a real-GPU balloon runs: allocate N bytes, report, hold until killed.
_TORCH_CHILD = """
import sys, time, torch
n = int(sys.argv[1]); x = torch.empty(n, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("held", n, flush=True)
while True: time.sleep(3600)
"""
_CUPY_CHILD = """
import sys, time, cupy
n = int(sys.argv[1]); x = cupy.empty(n, dtype=cupy.uint8); cupy.cuda.Device().synchronize()
print("held", n, flush=True)
while True: time.sleep(3600)
"""


class ProcessBalloon:
    """A real-GPU balloon: one child process per size, replaced when the size changes."""

    def __init__(self, timeout_s: float = 60.0):
        if importlib.util.find_spec("torch"):
            self._code = _TORCH_CHILD
        elif importlib.util.find_spec("cupy"):
            self._code = _CUPY_CHILD
        else:
            raise ConfigError("a balloon on a real GPU needs PyTorch or CuPy installed (pip install torch)")
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self.held_bytes = 0

    def free_bytes(self) -> int | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free)
        except Exception:  # no NVML: the caller must then give hold_gib, not a share
            return None

    def set_bytes(self, nbytes: int) -> None:
        from vramlab.errors import VramlabError

        self.release()
        if nbytes <= 0:
            return
        proc = subprocess.Popen(
            [sys.executable, "-c", self._code, str(nbytes)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._proc = proc
        assert proc.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        line = b""
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            if line.startswith(b"held"):
                self.held_bytes = nbytes
                return
        out = line.decode(errors="replace").strip()
        self.release()
        raise VramlabError(f"balloon: could not hold {gib(nbytes, unit=True)} on the GPU: {out[-200:]}")

    def release(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait(timeout=10)
        self._proc = None
        self.held_bytes = 0


class CoLoaded:
    """Extra models started next to the target (sim only: more `vramlab sim serve` on the same card)."""

    def __init__(self, device: str, settings: Any, workdir: Path):
        self.device, self.settings, self.workdir = device, settings, workdir
        self.procs: list[Any] = []

    def set_count(self, n: int) -> None:
        from vramlab.sim.launch import start_sim

        while len(self.procs) < n:
            i = len(self.procs)
            # started one after another: simultaneous start-up is its own failure (vllm #55827)
            proc = start_sim(
                self.settings.argv(),
                device=self.device,
                wait_ready=False,
                log_path=str(self.workdir / f"coloaded-{i}.log"),
            )
            self.procs.append(proc)
            _wait_started(proc, 30.0)

    def release(self) -> None:
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception:  # best effort: every co-loaded model gets its chance to stop
                pass
        self.procs.clear()


def _wait_started(proc: Any, timeout_s: float) -> None:
    """Until it serves or exits (a refusal to start is a finding, not an error here)."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        import re

        m = re.search(r"(?:running|listening|Listening) on (http://[0-9.]+:\d+)", proc.log_text())
        if m:
            try:
                with urllib.request.urlopen(m.group(1) + "/health", timeout=1.0) as r:
                    if r.status == 200:
                        proc.url = m.group(1)
                        return
            except OSError:
                pass
        time.sleep(0.05)


__all__ = ["GIB", "Balloon", "CoLoaded", "CotenantOutOfMemory", "LedgerBalloon", "ProcessBalloon"]
