"""Faults a drill can inject: a hang, slow steps, a crash, a CUDA OOM at the next allocation.

Armed from `--fault KIND[@AFTER_S][:FACTOR]` at start-up or `POST /sim/fault` at run time
(only with `--allow-fault-injection`). The engine consults this state once per step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from vramlab.errors import ConfigError
from vramlab.sim.config import FAULT_KINDS, Fault


@dataclass
class FaultState:
    hang: bool = False
    slow_factor: float = 1.0
    oom_next_allocation: bool = False
    crash: bool = False
    history: list[str] = field(default_factory=list)
    _unhang: asyncio.Event | None = None

    def apply(self, kind: str, factor: float = 10.0) -> None:
        if kind == "clear":
            self.hang, self.slow_factor, self.oom_next_allocation = False, 1.0, False
            if self._unhang:
                self._unhang.set()
        elif kind == "hang":
            self.hang = True
            self._unhang = asyncio.Event()
        elif kind == "slow":
            if factor <= 0:
                raise ConfigError("slow factor must be positive")
            self.slow_factor = factor
        elif kind == "oom":
            self.oom_next_allocation = True
        elif kind == "crash":
            self.crash = True
        else:
            raise ConfigError(f"unknown fault {kind!r}; choose from {', '.join((*FAULT_KINDS, 'clear'))}")
        self.history.append(kind)

    async def wait_unhang(self) -> None:
        if self.hang and self._unhang is not None:
            await self._unhang.wait()


async def arm(state: FaultState, faults: tuple[Fault, ...], wake: asyncio.Event) -> None:
    """Apply start-up faults after their delays (wall-clock seconds after the server is ready)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for f in sorted(faults, key=lambda f: f.after_s):
        await asyncio.sleep(max(0.0, start + f.after_s - loop.time()))
        state.apply(f.kind, f.factor)
        wake.set()
