"""The OOM drill's parts for the one runner (run/runner.py): baseline, ramp until the
target fails (or the ceiling), detect, recover, observe, roll back; every request, sample and
event into the store as it happens (kind "drill").

Rounds repeat the whole cycle. Stop conditions are armed from the first request to the last.
Rollback (balloon released, co-loaded models stopped, the sim the drill started stopped, the
plan's rollback commands) runs however the drill ends: completion, stop, error or Ctrl-C. The
rounds, the step loop, the events and the ending are the runner's; this module has no loop of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramlab import __version__
from vramlab.drill.cotenant import CotenantOutOfMemory
from vramlab.drill.detect import STALL, WALL_CLOCK, Detector, Finding
from vramlab.drill.fault import say_failure
from vramlab.drill.hang import InFlight, hung_result
from vramlab.drill.herd import HerdMonitor
from vramlab.drill.lifecycle import TargetLifecycle
from vramlab.drill.load import WindowPrompts, served_model, window_lanes
from vramlab.drill.local_targets import SimTarget, open_target
from vramlab.drill.plan import DrillPlan
from vramlab.drill.ramp import RampSteps, ramp_values
from vramlab.drill.recovery import LiveState, recover
from vramlab.drill.target import SPAWNED_KINDS, check_environment
from vramlab.drill.watch import Watchers
from vramlab.records import RunRecord, canonical_sha256, new_run_id
from vramlab.records import emit as E
from vramlab.records.store import Store
from vramlab.run.baseline_check import BaselineTally
from vramlab.run.capacity_plan import PlanFacts, target_facts
from vramlab.run.kind import Where
from vramlab.run.steps import StepOutcome, StepStrategy
from vramlab.run.window import WindowExecutor, request_record

if TYPE_CHECKING:
    from vramlab.drill.colocation_run import ColocationRun
    from vramlab.load.client import RequestResult
    from vramlab.run.rollback import RollbackResult
    from vramlab.run.runner import Runner


DEFAULT_WALL_S = 300.0  # a drill plan that sets no wall clock (the session's watchdog waits past it)


@dataclasses.dataclass
class _Tallies:
    """What the round's requests got so far (baseline_check's tallies), per phase."""

    baseline: BaselineTally | None = None  # this round's baseline requests
    ramp: BaselineTally | None = None  # every ramp step's requests (what they got, in words)
    step: BaselineTally | None = None  # the running ramp step's requests
    # requests, errors (its StepOutcome)
    step_counts: list[int] = dataclasses.field(default_factory=lambda: [0, 0])


class DrillKind:
    """A drill plan as a kind of run: the runner calls these parts (run/kind.py's RunKind)."""

    step_phase = "ramp"

    def __init__(
        self,
        plan: DrillPlan,
        store: Store,
        *,
        override_env: bool = False,
        workdir: str | None = None,
        run_id: str | None = None,
    ) -> None:
        import tempfile

        self.plan = plan
        self.store = store
        self.warning = check_environment(plan.target, override_env)  # refuses before anything is touched
        self.run_id = run_id or new_run_id()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"vramlab-drill-{self.run_id}-"))
        self.target = open_target(plan.target, self.workdir)
        self.rounds = range(plan.rounds)
        self.values = ramp_values(plan.ramp)
        self.wall_clock_s = plan.stop_conditions.wall_clock_s or DEFAULT_WALL_S
        self.state = LiveState()
        self.detector = self._detector()
        self.herd = HerdMonitor()
        self.windows = WindowExecutor()  # the experiment's window executor, on this round's client
        self.prompts = WindowPrompts(plan)
        self.tallies = _Tallies()
        self.failed_rounds: list[int] = []
        self.unrecovered_rounds: list[int] = []
        self._failure: Finding | None = None
        self._last: float | None = None  # the last step that completed
        self._ceiling_value: float | None = None
        self._step_started_s = 0.0
        self._failed_step = 0  # the step the target failed during (its value stays on without undo_ramp)
        self._draining: asyncio.Future[Any] | None = None  # the failed step's window, its requests ending
        self._totals = [0, 0]
        self.sender: InFlight | None = None  # the round's load client, counting its requests in flight

    def attach(self, run: Runner) -> None:
        self.run = run
        coloc: ColocationRun | None = None
        if self.plan.colocation is not None and isinstance(self.target, SimTarget):
            from vramlab.drill.colocation_run import ColocationRun

            coloc = ColocationRun(run, self.plan.colocation, self.target, self.workdir)
        self.lifecycle = TargetLifecycle(run, self.plan, self.target, self.workdir, coloc)
        self.watchers = Watchers(
            run, self.plan, self.target, self.lifecycle.device, coloc, self.detector, self.state
        )

    def _detector(self) -> Detector:
        """A round's detector; a hang is found after the plan's liveness grace (drill/hang.py)."""
        return Detector(
            self.plan.stop_conditions, engine=self._engine(), hang_grace_s=self.plan.recovery.liveness_grace_s
        )

    def _engine(self) -> str:
        t = self.plan.target
        engine: str = t.sim.engine if (t.kind == "sim" and t.sim) else t.engine
        return engine

    # -- the run's start ---------------------------------------------------------------------
    async def record(self) -> tuple[str, RunRecord]:
        plan = self.plan
        run = RunRecord(
            run_id=self.run_id,
            kind="drill",
            name=plan.name,
            plan=plan.model_dump(mode="json", by_alias=True),
            plan_hash=canonical_sha256(plan.model_dump(mode="json", by_alias=True)),
            fixed={
                "engine": self._engine(),
                "vramlab_version": __version__,
                "host": os.uname().nodename,
                **(
                    {"model": plan.target.sim.model, "gpu_name": plan.target.sim.gpu}
                    if plan.target.sim
                    else ({"model": plan.target.model} if plan.target.model else {})
                ),
            },
            target={
                "kind": plan.target.kind,
                "environment": plan.target.environment,
                "base_url": plan.target.base_url,
            },
            change={
                "variable": plan.ramp.knob,
                "unit": plan.ramp.unit,
                "steps": self.values,
                "mode": plan.ramp.mode,
            },
            started_at=time.time(),
            notes=[self.warning] if self.warning else [],
        )
        return f"drill {plan.name} ({self.run_id})", run

    async def started(self) -> None:
        if self.warning:
            self.run.emit(E.WARNING(self.warning))
        for line, plan_field in self.plan.field_warnings():  # old field names the plan used, too few rounds
            self.run.emit(E.WARNING(line, {"plan_field": plan_field} if plan_field else None))

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        await self.lifecycle.bring_up()
        self.run.note(await self.prompts.open(stack, self.target.url))

    def capacity_facts(self) -> PlanFacts:
        """The target's settings (its sim's, or the plan's capacity: block) and the log it writes."""
        tg = self.plan.target
        log = getattr(self.target, "log_path", None)
        sim = tg.sim if tg.kind == "sim" else None
        return target_facts(tg.model, tg.engine, sim, self.plan.capacity, str(log) if log else tg.log_file)

    # -- one round ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def round(self, rnd: int) -> AsyncIterator[None]:
        """The round's client and watchers; a fresh detector and live state."""
        from vramlab.load.client import OpenAIClient

        plan = self.plan
        self._ceiling_value, self._failure, self._last = None, None, None
        # the first round uses the ones built with the kind: nothing fed them yet
        if rnd != self.rounds.start:
            self.state = LiveState()
            self.detector = self._detector()
        conns = max(64, int(max(self.values)) + 8 if plan.ramp.knob in ("concurrency", "batch") else 64)
        await self.prompts.prepare(rnd, self.values)
        async with OpenAIClient(
            self.target.url,
            served_model(plan),
            api=plan.target.api,
            max_connections=conns,
            timeout_s=plan.load.request_timeout_s,
        ) as client:
            self.sender = InFlight(client)
            self.windows.use(self.sender)
            watchers = [
                asyncio.ensure_future(c)
                for c in self.watchers.watch(self.detector, self.state, self.lifecycle.health_path)
            ]
            try:
                yield
            finally:
                await self._end_draining()
                for w in watchers:
                    w.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)
        stopped = self.detector.stopped
        if stopped is not None and stopped.kind == WALL_CLOCK:
            self.run.halt(stopped.message)

    async def _end_draining(self) -> None:
        """The failed step's requests still in flight at the round's end: given their own timeout
        from the failure, then cancelled (recorded as still open when the round ended)."""
        task, self._draining = self._draining, None
        if task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), timeout=self.plan.load.request_timeout_s + 1.0)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def baseline(self, rnd: int) -> None:
        """The baseline window; a baseline that breached its own error threshold ends the drill before the ramp."""
        self.tallies = _Tallies(baseline=BaselineTally(self.plan.stop_conditions.error_rate))
        self.run.emit(E.PHASE_START("baseline", {"phase": "baseline"}))
        await self._window(None, self.plan.baseline_s, 0)
        self.run.emit(E.PHASE_END("baseline"))
        why = self.tallies.baseline.broken() if self.tallies.baseline is not None else None
        if why is not None:
            from vramlab.drill.watch import last_error_line

            # a local target's log: the engine's words when its answers had none
            said = last_error_line(self.target)
            ended = f"baseline broken, nothing ramped: {why}" + (f"; its log says: {said}" if said else "")
            self.run.halt(ended)
            self.run.emit(E.STOPPED(ended, {"reason": "baseline"}))
            return
        self.tallies.ramp = BaselineTally(None)

    # -- the ramp's steps (the runner's step loop calls these) ----------------------------------
    def steps(self) -> StepStrategy:
        return RampSteps(self.plan.ramp)

    def begin_step(self, step: int, value: float) -> None:
        ramp = self.plan.ramp
        self.tallies.step_counts = [0, 0]
        self.tallies.step = BaselineTally(None)
        self._step_started_s = self.run.now()
        self.run.emit(
            E.STEP(f"{ramp.knob} = {value:g} {ramp.unit}", {"step": step, "value": value, "knob": ramp.knob})
        )

    async def apply(self, value: float) -> bool:
        try:
            await self.lifecycle.apply(value)
        except CotenantOutOfMemory as exc:
            # the co-tenant, not the target, ran out: the card is full and the target held its memory
            self.run.emit(
                E.COTENANT_OOM(
                    f"the co-tenant could not grow to {value:g} {self.plan.ramp.unit}: {exc}",
                    {"value": value},
                )
            )
            self._ceiling_value = self._last
            return False
        return True

    async def window(self, rnd: int, step: int, value: float) -> None:
        await self._window(value, self.plan.ramp.step_s, step)

    def step_failed(self) -> bool:
        self._failure = self.detector.failure()
        return self._failure is not None

    def on_step_failure(
        self, step: int, value: float, last: float | None, window: asyncio.Future[Any] | None
    ) -> bool:
        f = self._failure
        assert f is not None, "on_step_failure without a failure"
        self._failed_step = step
        if f.kind != WALL_CLOCK:  # the drill's own time running out is no failure of the target
            self.state.failed_at_s = self.state.failed_at_s or f.t_s
        step_started_s, tally = self._step_started_s, self.tallies.step
        say_failure(self.run.emit, self.plan.ramp, self.detector, f, step, value, last, step_started_s, tally)
        if f.kind == WALL_CLOCK:
            self.run.halt(f.message)  # not a failure of the target: the drill ends as stopped
            return False
        if window is None:
            return False
        # the step sends nothing more; what it has in flight ends as what it is (a hung request
        # times out), not "cancelled" by the move to recovery; a hang found from health and progress ends
        # them now, as timeouts at the hang (drill/hang.py)
        self.windows.cancel() if f.kind == STALL else self.windows.end()
        self._draining = window
        return True

    def end_step(self, step: int, value: float) -> StepOutcome:
        self._last = value
        counts = self.tallies.step_counts
        return StepOutcome(step, value, counts[0], counts[1], None, None)

    def tick(self) -> None:
        now = self.run.now()
        self.detector.on_clock(now, now, self.sender.open if self.sender is not None else None)

    # -- after the ramp ------------------------------------------------------------------------
    async def recovery(self, rnd: int, failed: bool) -> None:
        """The target failed: recover it (a ramp that held has nothing to recover)."""
        if failed:
            assert self._failure is not None
            await self._recover(self._failure)
            self.failed_rounds.append(rnd)

    async def steps_held(self, rnd: int) -> None:
        """No step failed: the ceiling held (or the ramp held nothing)."""
        plan, ramp = self.plan, self.tallies.ramp
        came_back = ramp.ok + ramp.failed if ramp is not None else 0
        if came_back == 0:
            # a ramp that sent nothing (a burst too large to build), or whose requests never
            # came back, held nothing: no ceiling claim
            sent = ramp.sent if ramp is not None else 0
            why = (
                "the ramp sent no request"
                if not sent
                else f"no ramp request came back ({sent} sent, all still open when their step ended)"
            )
            self.run.halt(f"{why}: no ceiling is claimed")
            self.run.emit(E.STOPPED(f"{why}: no ceiling is claimed", {"reason": "no_load"}))
            return
        top = self.values[-1] if self._ceiling_value is None else self._ceiling_value
        why = "" if self._ceiling_value is None else " (the card was full: the co-tenant could not grow)"
        # refusals (a context too long for the engine) fail requests without failing the target: said
        but = f", but {ramp.failures('ramp')}" if ramp is not None and ramp.failed else ""
        unit = plan.ramp.unit
        self.run.emit(E.CEILING(f"no OOM up to {top:g} {unit}{why}{but}", {"value": top, "unit": unit}))

    async def _recover(self, failure: Finding) -> None:
        plan, where = self.plan, self.run.where
        # undo: back to the baseline load (so "P95 back to baseline" compares like with like);
        # otherwise the failing step's load stays on, which tests for a second OOM
        value: float | None = None if plan.recovery.undo_ramp else self.values[self._failed_step - 1]
        if plan.recovery.undo_ramp:
            await self.lifecycle.apply(None)
            self.run.emit(E.RAMP_UNDONE("load back to the baseline", {"value": None}))
        ex = WindowExecutor()  # the failed step's window may still be draining on self.windows
        ex.use(self.windows.client)
        load = asyncio.ensure_future(
            self._window(value, plan.recovery.limit_s + plan.recovery.observe_s + 5, 0, ex)
        )
        try:
            out = await recover(
                plan.recovery,
                self.target,
                self.state,
                self.run.now,
                self.run.emit,
                operator_notes=self._notes_since,
                supervised_by_drill=plan.target.kind in SPAWNED_KINDS,
                startup_allowance_s=self.lifecycle.startup_allowance_s(),
                on_restart=self.detector.on_restart,
            )
            if out.recovered:
                t0 = self.detector.first_evidence_s()
                t0 = t0 if t0 is not None else (failure.t_s or 0.0)
                # not yet the verdict: that also wants health 200 and P95 back over the observation window
                self.run.emit(
                    E.RECOVERED(
                        f"serving again {(out.served_again_s or 0.0) - t0:.2f} s after T0 (a "
                        f"successful request); the verdict follows the {plan.recovery.observe_s:g} s "
                        "observation",
                        {"served_again_s": out.served_again_s},
                    )
                )
                await asyncio.sleep(plan.recovery.observe_s)
            else:
                self.unrecovered_rounds.append(where.round or 0)
                self.run.emit(E.NOT_RECOVERED(out.reason, {"limit_s": plan.recovery.limit_s}))
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
            # settle the fault's mode now that recovery showed more (a refusal on restart, ...)
            mode, evidence = self.detector.failure_mode(), self.detector.evidence()
            self.run.emit(
                E.FAILURE_MODE(
                    f"failure mode {mode}" + (f": {evidence[0]}" if evidence else ""),
                    {"mode": mode, "evidence": evidence, "signature": self.detector.signature()},
                )
            )
            self.run.emit(E.PHASE_END("recovery"))

    def _notes_since(self, t_s: float) -> list[str]:
        evs = self.store.events(self.run_id)
        return [e.message for e in evs if e.kind == "note" and e.t_s >= t_s]

    def after_rounds(self) -> None:
        if not self.plan.prometheus_url:
            self._evaluate_alerts()

    def _evaluate_alerts(self) -> None:
        """Alerts evaluated on the drill's own samples."""
        from vramlab.drill.alerting import evaluate_rules

        store, run_id = self.store, self.run_id
        for ev in evaluate_rules(self.plan.alerts, store.samples(run_id), store.requests(run_id)):
            self.run.emit(E.ALERT(f"{ev['name']} {ev['state']}", ev), t_s=ev["t_s"], where=Where())

    async def rollback(self, status: str, reason: str | None) -> list[RollbackResult]:
        await self.lifecycle.rollback(status, reason)
        return []  # the drill's rollbacks are rollback events

    def run_end(self, status: str, reason: str | None) -> E.Draft:
        return E.RUN_END(reason or status, {"status": status, "ended_at": time.time(), "stop_reason": reason})

    def totals(self) -> tuple[int, int]:
        return self._totals[0], self._totals[1]

    # -- load ---------------------------------------------------------------------------------
    async def _window(
        self, value: float | None, duration_s: float, step: int, ex: WindowExecutor | None = None
    ) -> None:
        phase, rnd = self.run.where.phase or "ramp", self.run.where.round or 0

        def record(res: RequestResult, user: int) -> None:
            self._on_result(res, phase, rnd, step, value, user)

        # the input set built for the window (WindowPrompts.prepare): keyed by the ramp value's index,
        # the failing step's in a recovery that keeps its load on
        index = (self._failed_step if phase == "recovery" else step) - 1
        prompts = await self.prompts.get(value, phase, rnd, index)
        lanes, retry = window_lanes(self.plan, value, prompts, duration_s, phase, rnd, step, record)
        await (ex or self.windows).run(lanes, retry, end_drain_s=self.plan.load.request_timeout_s + 0.5)

    def _on_result(
        self, res: RequestResult, phase: str, rnd: int, step: int, value: float | None, user: int
    ) -> None:
        hang = self.detector.stopped
        if res.error_class == "cancelled" and phase == "ramp" and hang is not None and hang.kind == STALL:
            res = hung_result(res, hang)
        elif res.error_class == "cancelled" and self.state.failed_at_s is not None:
            res = dataclasses.replace(
                res,
                error=f"still open when the drill's {phase} load ended: neither answered "
                "nor timed out by then",
            )
        # the detector reads how long a failed request took (a timeout), so failures keep their latency
        rec = request_record(
            res,
            self.run_id,
            self.run.t0,
            rnd,
            phase if phase in ("baseline", "recovery") else "ramp",
            step,
            value,
            failed_latency=True,
        )
        self.run.emit(E.request(rec))
        end = rec.end_s or self.run.now()
        t = self.tallies
        if phase == "baseline" and t.baseline is not None:
            t.baseline.add(rec.ok, rec.error_class, rec.status_code, rec.error)
        if phase == "ramp" and t.step is not None and t.ramp is not None:
            t.step.add(rec.ok, rec.error_class, rec.status_code, rec.error)
            t.ramp.add(rec.ok, rec.error_class, rec.status_code, rec.error)
        if res.error_class == "cancelled":
            return
        self._totals[0] += 1
        self._totals[1] += not rec.ok
        if phase == "ramp":
            t.step_counts[0] += 1
            t.step_counts[1] += not rec.ok
        if rec.ok:
            self.state.last_success_s = end
        self.detector.on_result(
            end, rec.ok, rec.status_code, rec.error_class, rec.error, rec.e2e_from_scheduled_ms
        )
        amp = self.herd.on_attempt(rec.sent_s or end, phase, rec.attempt)
        if amp is not None:
            self.run.emit(
                E.RETRY_STORM(
                    f"attempt rate {amp:.1f}x the baseline's offered rate in one {self.herd.window_s:g} s "
                    "window of recovery, mostly retries (live; the report judges the whole recovery window)",
                    {"amplification": amp, "window_s": self.herd.window_s},
                )
            )


__all__ = ["DrillKind"]
