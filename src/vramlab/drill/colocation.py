"""The co-location drill: several sim engines on one simulated card, as `vramlab pack` would run them.

The plan's `colocation:` section names the engines that share the target's card (each with the
settings and start order pack emits). Before the usual baseline/ramp, the drill:

    start_in_order   every engine in pack's start order, each after the previous is healthy -> all up
    race             all stopped, then started at once (a start barrier makes "at once" exact at
                     high --speed): vLLM's free-memory check passes for each, then they charge each
                     other's loading to themselves (vllm #55827) -> who started, who refused, and how
    restart_in_order the survivors stopped, everyone started in order again, so the load phase
                     runs on a healthy card

The engines other than the target are then probed as neighbours (blast radius) and watched for
exit; the `coloaded_model` ramp adds `colocation.added` models on the same ledger. Every engine
start and exit becomes an `engine` event: started / refused (with the engine's text) / crashed.
Rollback stops every engine and reads the ledger back to show nothing the drill started holds memory.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vramlab.errors import VramlabError
from vramlab.plandoc import SimSettings
from vramlab.records.event_payloads import EngineData

Outcome = Literal["started", "refused", "crashed", "timeout", "stopped"]

# A sim's root cause line, not the engine's generic wrapper ("Engine core initialization failed").
_CAUSE = re.compile(r"(?:\w+Error|\w+Exception): .+|Not enough memory.*|cudaMalloc failed.*|out of memory.*")
_WRAPPERS = ("initialization failed", "EngineDeadError", "Received sigquit")


class ColocatedEngine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    start_order: int = Field(ge=1)
    sim: SimSettings


class ColocationSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_name: str = "target"
    target_start_order: int = Field(1, ge=1)
    engines: list[ColocatedEngine] = Field(min_length=1)
    race: bool = True  # restart everyone at once and record the start-up race
    ready_timeout_s: float = Field(30.0, gt=0)  # per engine start
    probe_interval_s: float = Field(0.25, gt=0)  # neighbour probes of the engines besides the target
    probe: Literal["generate", "health"] = "generate"  # generate: one token per probe (drill/probes.py)
    added: SimSettings | None = (
        None  # what the coloaded_model ramp starts (default: ramp.model on target.sim)
    )

    @model_validator(mode="after")
    def _check(self) -> ColocationSpec:
        names = [self.target_name, *(e.name for e in self.engines)]
        if len(set(names)) != len(names):
            raise ValueError("colocation: engine names (and target_name) must be unique")
        orders = [self.target_start_order, *(e.start_order for e in self.engines)]
        if len(set(orders)) != len(orders):
            raise ValueError("colocation: start_order values must be unique (one engine at a time)")
        return self


def start_sequence(spec: ColocationSpec) -> list[str]:
    """Engine names in the order they start (pack's start order; the target takes its own place)."""
    pairs = [(spec.target_start_order, spec.target_name), *((e.start_order, e.name) for e in spec.engines)]
    return [name for _, name in sorted(pairs)]


@dataclass(frozen=True)
class StartResult:
    name: str
    outcome: Outcome
    exit_code: int | None
    ready_s: float | None  # from the start command to /health 200
    text: str  # the engine's own root-cause line ("" when it started)

    def data(self) -> EngineData:
        return {
            "engine": self.name,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "ready_s": self.ready_s,
            "text": self.text,
        }


def cause_line(log_text: str) -> str:
    """The engine's root-cause line from its log: the last error that is not a generic wrapper."""
    found = ""
    for line in log_text.splitlines():
        m = _CAUSE.search(line)
        if m and not any(w in line for w in _WRAPPERS):
            found = m.group(0).strip()
    return found[:300]


def classify_start(
    name: str, exit_code: int | None, ready: bool, ready_s: float | None, log_text: str
) -> StartResult:
    """started: answered health; refused: exited before it did; timeout: neither within the limit."""
    if ready and exit_code is None:
        return StartResult(name, "started", None, ready_s, "")
    if exit_code is not None:
        return StartResult(
            name, "refused", exit_code, None, cause_line(log_text) or f"exited with code {exit_code}"
        )
    return StartResult(name, "timeout", None, None, cause_line(log_text) or "no health 200 within the limit")


def wait_ready(url: str, poll: Any, timeout_s: float) -> tuple[bool, float | None]:
    """Until /health answers 200 or the process exits; (ready, seconds waited)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if poll() is not None:
            return False, None
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=1.0) as r:
                if r.status == 200:
                    return True, time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.03)
    return False, None


class ColocatedEngines:
    """The engines besides the target: fixed ports (stable neighbour URLs across restarts), one log
    per start, and the pids ever started (to check the ledger after the rollback)."""

    def __init__(self, spec: ColocationSpec, device: str, workdir: Path):
        from vramlab.drill.local_targets import free_port

        self.spec, self.device, self.workdir = spec, device, workdir
        self.settings = {e.name: e.sim for e in spec.engines}
        self.ports = {e.name: free_port() for e in spec.engines}
        self.procs: dict[str, Any] = {}
        self.pids: set[int] = set()
        self._starts = 0
        # Starts run in worker threads: after a Ctrl-C the rollback may run while one is still
        # starting. Once released, no engine may start, so none outlives the rollback.
        self._lock = threading.Lock()
        self.released = False

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Hold while starting any engine (the target too); refuses once the rollback began."""
        with self._lock:
            if self.released:
                raise VramlabError("the drill is rolling back: no engine may start now")
            yield

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, name: str, barrier: str | None = None) -> Any:
        from vramlab.sim.launch import start_sim

        with self.guard():
            self._starts += 1
            argv = self.settings[name].argv() + (["--start-barrier", barrier] if barrier else [])
            proc = start_sim(
                argv,
                port=self.ports[name],
                device=self.device,
                wait_ready=False,
                log_path=str(self.workdir / f"{name}-{self._starts}.log"),
            )
            self.procs[name] = proc
            self.pids.add(proc.pid)
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.stop()

    def release(self) -> None:
        with self._lock:  # waits for a start in progress, then closes the door
            self.released = True
        for name in list(self.procs):
            try:
                self.stop(name)
            except Exception:  # best effort: every engine gets its chance to stop
                pass


def drill_pids_on_ledger(device: str, pids: set[int]) -> tuple[int, list[int]]:
    """(bytes still used on the card, the drill's pids that still hold memory)."""
    from vramlab.sim.ledger import DeviceLedger

    led = DeviceLedger(device)
    procs = led.processes(0)
    return int(led.memory_info(0)[1]), sorted(pid for pid, _, _ in procs if pid in pids)


__all__ = [
    "ColocatedEngine",
    "ColocatedEngines",
    "ColocationSpec",
    "StartResult",
    "cause_line",
    "classify_start",
    "drill_pids_on_ledger",
    "start_sequence",
    "wait_ready",
]
