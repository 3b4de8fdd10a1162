"""The drill's target lifecycle: bring it up (co-located engines, start, health discovery, the
measured load time, the co-tenant, the capacity prediction), turn the ramp's knob (a balloon,
co-loaded models; the load-shaped knobs live in the window) and roll back whatever the drill
changed, however it ends. It emits through the one runner (run/runner.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramlab.drill.cotenant import Balloon, CoLoaded, CotenantOutOfMemory, LedgerBalloon, ProcessBalloon
from vramlab.drill.local_targets import SimTarget
from vramlab.drill.plan import DrillPlan
from vramlab.drill.target import SPAWNED_KINDS, Target
from vramlab.errors import ConfigError, VramlabError
from vramlab.records import emit as E
from vramlab.units import GIB, gib

if TYPE_CHECKING:
    from vramlab.drill.colocation_run import ColocationRun
    from vramlab.plandoc import RecoverySpec
    from vramlab.run.runner import Runner


class TargetStartCrash(VramlabError):
    """The target the drill started exited before it answered: work had begun (the store holds the
    run), so exit 1, not the bad-input 2."""

    exit_code = 1


class TargetLifecycle:
    """What the drill starts and changes on the card, and its undoing."""

    def __init__(
        self, run: Runner, plan: DrillPlan, target: Target, workdir: Path, coloc: ColocationRun | None
    ) -> None:
        self.run, self.plan, self.target, self.workdir, self.coloc = run, plan, target, workdir, coloc
        self.device = target.device if isinstance(target, SimTarget) else None
        self._balloon: Balloon | None = None
        self._cotenant: Balloon | None = None
        self._coloaded: CoLoaded | None = None
        self._started_target = False
        self.health_path = plan.target.health_path  # replaced by what answered at bring-up (discover_health)
        self.load_time_s: float | None = None  # the first start's measured load time (start -> health 200)

    async def bring_up(self) -> None:
        self.run.where.phase = "setup"
        if self.coloc is not None:
            await self.coloc.bring_up()  # sequential start, the start-up race, everyone up in order again
        st = await asyncio.to_thread(self.target.status)
        started = None
        if not st.running:
            self.run.emit(E.TARGET_START(f"starting the target ({self.plan.target.kind})"))
            started = self.run.now()
            await asyncio.to_thread(self.target.start)
            self._started_target = True
        from vramlab.observe.health import discover_health

        limit = max(30.0, self.plan.recovery.startup_s or 0.0, self.plan.target.timeout_for("start"))
        wall = self.plan.stop_conditions.wall_clock_s
        clipped = wall is not None and wall - self.run.now() < limit
        if (
            wall is not None and clipped
        ):  # the drill's wall clock bounds its start too (a closed port must not
            limit = max(1.0, wall - self.run.now())  # outlast it)
        found = await discover_health(
            self.target.url,
            self.plan.target.health_path,
            limit,
            alive=lambda: self.target.status().running if self._local() else True,
        )
        if found.path is None:
            st = await asyncio.to_thread(self.target.status)
            if started is not None and not st.running:  # a start-up crash: say so, in the engine's own words
                from vramlab.drill.evidence import exit_evidence

                tail = _log_tail(self.target)
                raise TargetStartCrash(
                    f"the target process {exit_evidence(st.exit_code)} {self.run.now() - started:.1f} s "
                    f"after it was started, before it answered on {self.target.url}"
                    + ("; its log ends:\n    " + "\n    ".join(tail) if tail else "; its log is empty")
                )
            why = " (the drill's wall clock)" if clipped else ""
            raise VramlabError(
                f"the target at {self.target.url} did not pass a health check within {limit:.3g} s"
                f"{why}: {found.summary()}"
            )
        self.health_path = found.path
        self.run.emit(E.HEALTH_PATH(found.summary(), {"path": found.path, "answers": found.answers}))
        if started is not None:
            self.load_time_s = self.run.now() - started
            self.run.emit(
                E.TARGET_READY(
                    f"the target loaded in {self.load_time_s:.2f} s (start to health 200 on {found.path})",
                    {"load_time_s": self.load_time_s},
                )
            )
        if self.plan.cotenant is not None:
            self._cotenant = self._make_balloon()
            nbytes = self.plan.cotenant.bytes_to_hold(self._cotenant.free_bytes())
            try:
                await asyncio.to_thread(self._cotenant.set_bytes, nbytes)
            except CotenantOutOfMemory as exc:  # the plan asks for more than the card has free
                raise ConfigError(
                    f"cotenant: could not hold {gib(nbytes, unit=True)} before the ramp: "
                    f"{str(exc)[:200]}; lower cotenant.hold_gib (the drill was rolled back)"
                ) from None
            self.run.emit(E.COTENANT(f"co-tenant holds {gib(nbytes, unit=True)}", {"bytes": nbytes}))
        self._capacity_account()

    def _capacity_account(self) -> None:
        """What the capacity model predicts for this ramp, before it starts (sim targets)."""
        if self.device is None:
            return
        from vramlab.drill.capacity_account import for_sim
        from vramlab.sim.ledger import DeviceLedger

        try:
            acc = for_sim(self.plan, int(DeviceLedger(self.device).memory_info(0)[2]))
        except Exception as exc:  # a model the catalog lacks must not stop the drill; the report says so
            self.run.emit(E.WARNING(f"no capacity prediction: {type(exc).__name__}: {exc}"[:300]))
            return
        if acc is not None:
            self.run.emit(E.CAPACITY(acc.message, {"predicted_limit": acc.predicted_limit, **acc.figures}))

    def _make_balloon(self) -> Balloon:
        return LedgerBalloon(self.device) if self.device else ProcessBalloon()

    def _local(self) -> bool:
        return self.plan.target.kind in SPAWNED_KINDS

    async def apply(self, value: float | None) -> None:
        """Turn the ramp's knob to *value* (None: back to the plan's own load); raises
        CotenantOutOfMemory when the card has no room for it."""
        knob = self.plan.ramp.knob
        if knob == "balloon":
            if self._balloon is None:
                self._balloon = self._make_balloon()
            await asyncio.to_thread(self._balloon.set_bytes, int((value or 0) * GIB))
        elif knob == "coloaded_model":
            if self.device is None or not self.plan.target.sim:
                raise ConfigError(
                    "ramp.knob coloaded_model needs a sim target (real co-loading: use target commands)"
                )
            if self._coloaded is None:
                settings = (self.coloc and self.coloc.coloaded_settings()) or self.plan.target.sim.model_copy(
                    update={"model": self.plan.ramp.model or self.plan.target.sim.model}
                )
                self._coloaded = CoLoaded(self.device, settings, self.workdir)
            if value is not None:
                t = time.monotonic()
                await asyncio.to_thread(self._coloaded.set_count, int(value))
                if self.coloc is not None:
                    self.coloc.report_coloaded(self._coloaded, time.monotonic() - t)

    def startup_allowance_s(self) -> float:
        """How long a restart may load before the supervisor judges its health: the plan's
        `recovery.startup_s`, else twice the first start's measured load time plus the grace."""
        rec: RecoverySpec = self.plan.recovery
        if rec.startup_s is not None:
            return rec.startup_s
        if self.load_time_s is not None:
            return 2 * self.load_time_s + rec.liveness_grace_s
        return max(30.0, rec.liveness_grace_s)

    async def rollback(self, status: str, reason: str | None) -> None:
        actions: list[tuple[str, Callable[[], None]]] = []
        if self._balloon is not None:
            actions.append(("release the ramp's balloon", self._balloon.release))
        if self._cotenant is not None:
            actions.append(("release the co-tenant", self._cotenant.release))
        if self._coloaded is not None:
            actions.append(("stop co-loaded models", self._coloaded.release))
        if self.coloc is not None:
            actions.append(("stop the co-located engines", self.coloc.release))
        if self._started_target or isinstance(self.target, SimTarget):
            actions.append(("stop the target the drill started", self.target.close))

        for what, fn in actions:
            try:
                await asyncio.shield(asyncio.to_thread(fn))
                self.run.emit(E.ROLLBACK(what, {"ok": True}))
            except Exception as exc:  # every rollback gets its chance; a failure is recorded, not raised
                self.run.emit(E.ROLLBACK(f"{what}: failed: {exc}"[:300], {"ok": False}))
        if self.coloc is not None:
            with contextlib.suppress(Exception):  # a ledger that cannot be read is no reason to skip the rest
                self.coloc.ledger_after()  # nothing the drill started may still hold memory
        if self.plan.rollback:
            from vramlab.run.rollback import run_rollbacks

            env = {
                "VRAMLAB_RUN_ID": self.run.run_id,
                "VRAMLAB_RUN_STATUS": status,
                "VRAMLAB_STOP_REASON": reason or "",
            }
            for res in await run_rollbacks(self.plan.rollback, env):
                self.run.emit(
                    E.ROLLBACK(f"{res.command}: exit {res.exit_code}", {"ok": res.ok, "command": res.command})
                )


def _log_tail(target: Any, n: int = 8) -> list[str]:
    """The last non-empty lines of a local target's log file (a process or the sim)."""
    path = getattr(target, "log_path", None)
    if not path:
        return []
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 16384))
            lines = [ln.rstrip() for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []
    return [ln[:300] for ln in lines[-n:]]


__all__ = ["TargetLifecycle", "TargetStartCrash"]
