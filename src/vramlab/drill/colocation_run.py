"""The co-location drill's phases, run at a drill's bring-up when the plan has a `colocation:` section.

Kept apart from the drill's parts (kind.py) so the plain OOM drill reads as before; this module
drives engine starts (blocking, in a thread) and turns each outcome into a timeline event through
the one runner (run/runner.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from vramlab.drill.colocation import (
    ColocatedEngines,
    ColocationSpec,
    StartResult,
    classify_start,
    drill_pids_on_ledger,
    start_sequence,
    wait_ready,
)
from vramlab.drill.local_targets import SimTarget
from vramlab.drill.plan import NeighbourSpec
from vramlab.records import emit as E

if TYPE_CHECKING:
    from pathlib import Path

    from vramlab.drill.cotenant import CoLoaded
    from vramlab.run.runner import Runner


class ColocationRun:
    def __init__(self, run: Runner, spec: ColocationSpec, target: SimTarget, workdir: Path):
        self.run, self.spec, self.target, self.workdir = run, spec, target, workdir
        self.device = target.device
        self.engines = ColocatedEngines(spec, target.device, workdir)
        self._races = 0
        self._reported_coloaded = 0
        self._up: dict[str, bool] = {}
        self._added: dict[str, Any] = {}  # the ramp's models, watched like the others once up

    # -- one engine -------------------------------------------------------------------------
    def _start(self, name: str, barrier: str | None = None) -> Any:
        """Start *name* without waiting; returns (url, poll, log_text) accessors."""
        if name == self.spec.target_name:
            with self.engines.guard():
                # a sim target: the rollback stops it however it was started
                self.target.start(
                    wait_ready=False, extra_args=["--start-barrier", barrier] if barrier else None
                )
                proc = self.target._proc
                self.engines.pids.add(proc.pid)
            return self.target.url, proc
        proc = self.engines.start(name, barrier)
        return self.engines.url(name), proc

    def _stop(self, name: str) -> None:
        if name == self.spec.target_name:
            self.target.stop()
        else:
            self.engines.stop(name)

    def _wait(self, name: str, url: str, proc: Any) -> StartResult:
        ready, ready_s = wait_ready(url, proc.poll, self.spec.ready_timeout_s)
        res = classify_start(name, proc.poll(), ready, ready_s, proc.log_text())
        self._up[name] = res.outcome == "started"
        return res

    def _start_and_wait(self, name: str) -> StartResult:
        return self._wait(name, *self._start(name))

    def _record(self, res: StartResult, phase: str) -> None:
        how = {
            "started": "up" if res.ready_s is None else f"up in {res.ready_s:.2f} s",
            "refused": f"refused (exit {res.exit_code}): {res.text}",
            "timeout": f"not ready in {self.spec.ready_timeout_s:g} s: {res.text}",
            "crashed": f"crashed (exit {res.exit_code}): {res.text}",
        }.get(res.outcome, res.outcome)
        self.run.emit(E.ENGINE(f"[{phase}] {res.name}: {how}"[:300], {"during": phase, **res.data()}))

    # -- phases (engine starts block in a thread; events are emitted from the loop) -------------
    async def _in_order(self, phase: str) -> list[StartResult]:
        self.run.where.phase = phase
        self.run.emit(E.PHASE_START(phase, {"phase": phase}))
        out = []
        for name in start_sequence(self.spec):
            res = await asyncio.to_thread(self._start_and_wait, name)
            self._record(res, phase)
            out.append(res)
        self.run.emit(E.PHASE_END(phase))
        return out

    def _stop_all(self) -> None:
        for name in reversed(start_sequence(self.spec)):
            self._stop(name)

    async def _at_once(self) -> list[StartResult]:
        self.run.where.phase = "race"
        self.run.emit(E.PHASE_START("race", {"phase": "race"}))
        self._races += 1
        names = start_sequence(self.spec)
        barrier = f"{self.workdir / f'race-{self._races}.barrier'}:{len(names)}"
        started = await asyncio.to_thread(lambda: [(n, *self._start(n, barrier)) for n in names])
        out = []
        for name, url, proc in started:
            res = await asyncio.to_thread(self._wait, name, url, proc)
            self._record(res, "race")
            out.append(res)
        self.run.emit(E.PHASE_END("race"))
        return out

    async def bring_up(self) -> None:
        """Sequential start, the race, then everyone up again in order; raises if that last fails."""
        from vramlab.errors import VramlabError

        first = await self._in_order("start_in_order")
        if self.spec.race:
            await asyncio.to_thread(self._stop_all)
            race = await self._at_once()
            failed = [f"{r.name} {r.outcome}" for r in race if r.outcome != "started"]
            self.run.emit(
                E.RACE(
                    ("start-up race: " + ", ".join(failed))
                    if failed
                    else "start-up race: every engine started (no race seen)",
                    {
                        "failed": [r.name for r in race if r.outcome != "started"],
                        "started": [r.name for r in race if r.outcome == "started"],
                    },
                )
            )
            await asyncio.to_thread(self._stop_all)
            first = await self._in_order("restart_in_order")
        down = [r for r in first if r.outcome != "started"]
        if down:
            raise VramlabError(
                "engines started one at a time did not all come up: "
                + "; ".join(f"{r.name}: {r.text}" for r in down)
            )

    # -- while the drill runs -----------------------------------------------------------------
    def neighbours(self) -> list[NeighbourSpec]:
        return [
            NeighbourSpec(
                name=e.name,
                url=self.engines.url(e.name),
                kind=self.spec.probe,
                model=e.sim.model,
                interval_s=self.spec.probe_interval_s,
                timeout_s=1.0,
            )
            for e in self.spec.engines
        ]

    async def watch_exits(self) -> None:
        """An engine besides the target that dies is a crash in the blast radius: recorded once."""
        while True:
            watched = {**self.engines.procs, **self._added}
            if self.target._proc is not None:
                watched[self.spec.target_name] = self.target._proc
            for name, proc in watched.items():
                code = proc.poll()
                if code is not None and self._up.get(name):
                    self._up[name] = False
                    from vramlab.drill.colocation import cause_line

                    self._record(
                        StartResult(name, "crashed", code, None, cause_line(proc.log_text())),
                        self.run.where.phase or "",
                    )
            await asyncio.sleep(0.1)

    def coloaded_settings(self) -> Any:
        return self.spec.added

    def report_coloaded(self, coloaded: CoLoaded, elapsed_s: float | None = None) -> None:
        """Outcome of each model the ramp added since the last call (CoLoaded waits for each);
        *elapsed_s*: how long the step's starts took (one model per step: its time to health)."""
        for i in range(self._reported_coloaded, len(coloaded.procs)):
            proc = coloaded.procs[i]
            self.engines.pids.add(proc.pid)
            code = proc.poll()
            name = f"added-{i + 1}"
            one = len(coloaded.procs) - self._reported_coloaded == 1
            res = classify_start(
                name, code, code is None and bool(proc.url), elapsed_s if one else None, proc.log_text()
            )
            self._added[name] = proc
            self._up[name] = res.outcome == "started"
            self._record(res, "ramp")
        self._reported_coloaded = len(coloaded.procs)

    # -- rollback ------------------------------------------------------------------------------
    def release(self) -> None:
        self.engines.release()

    def ledger_after(self) -> None:
        used, left = drill_pids_on_ledger(self.device, self.engines.pids)
        msg = (
            f"ledger after rollback: {used} bytes used, none held by the drill's {len(self.engines.pids)} engine "
            "processes"
            if not left
            else f"ledger after rollback: drill processes {left} still hold memory"
        )
        self.run.emit(
            E.LEDGER(
                msg, {"used_bytes": used, "drill_pids_left": left, "drill_pids": sorted(self.engines.pids)}
            )
        )


__all__ = ["ColocationRun"]
