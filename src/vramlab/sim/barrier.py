"""A start barrier: several sims started "at once" meet at the same points of their start-up.

Real engines started together take tens of seconds to load, so their start-ups overlap whatever
the scheduler does; at `--speed 200` a load takes milliseconds and two processes that started a
fraction of a second apart would never meet. The barrier restores the overlap deterministically:
every sim writes its arrival at a stage into one file (flock) and waits until N have arrived.
Rehearsal only (`--start-barrier FILE:N`); a peer that never arrives releases the wait after
`timeout_s` of wall clock, so a barrier cannot hang a drill.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class StartBarrier:
    path: str
    parties: int
    timeout_s: float = 20.0

    @classmethod
    def parse(cls, text: str) -> StartBarrier:
        path, sep, n = text.rpartition(":")
        if not sep or not path or not n.isdigit() or int(n) < 1:
            raise ValueError(f"--start-barrier wants FILE:N (N >= 1), not {text!r}")
        return cls(path, int(n))

    def _arrive(self, stage: str) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, f"{stage} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    def arrived(self, stage: str) -> int:
        try:
            with open(self.path) as fh:
                return sum(1 for line in fh if line.split(" ", 1)[0] == stage)
        except OSError:
            return 0

    async def wait(self, stage: str) -> bool:
        """Arrive at *stage* and wait for every party; False when the wait timed out."""
        self._arrive(stage)
        deadline = time.monotonic() + self.timeout_s
        while self.arrived(stage) < self.parties:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True


__all__ = ["StartBarrier"]
