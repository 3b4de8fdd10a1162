"""The drill: baseline, ramp until the target fails (or the ceiling), detect, recover, observe,
roll back; every request, sample and event into the store as it happens (kind "drill").

Rounds repeat the whole cycle. Stop conditions are armed from the first request to the last.
Rollback (balloon released, co-loaded models stopped, the sim the drill started stopped, the
plan's rollback commands) runs however the drill ends: completion, stop, error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlab.drill.cotenant import GIB, CoLoaded, CotenantOutOfMemory
from vramlab.drill.detect import Detector, Finding
from vramlab.drill.herd import HerdMonitor
from vramlab.drill.lifecycle import TargetLifecycle
from vramlab.drill.local_targets import SimTarget, open_target
from vramlab.drill.plan import DrillPlan
from vramlab.drill.ramp import RampSteps
from vramlab.drill.recovery import LiveState, recover
from vramlab.drill.target import check_environment
from vramlab.drill.watch import Watchers
from vramlab.experiment.baseline_check import BaselineTally
from vramlab.experiment.events import Event, EventHook
from vramlab.experiment.steps import StepOutcome, StepStrategy
from vramlab.experiment.window import Lane, WindowExecutor, request_record
from vramlab.records import RunRecord, canonical_sha256, new_run_id
from vramlab.records.store import Store

# In the recovery phase a user whose connection was refused tries again within this: the first
# successful request after a restart ("serving again") is timed to it, not to the user's back-off.
PROBE_RESOLUTION_S = 0.25


@dataclass
class DrillResult:
    run_id: str
    status: str
    stop_reason: str | None
    failed_rounds: list[int] = field(default_factory=list)
    workdir: str = ""
    unrecovered_rounds: list[int] = field(default_factory=list)  # failed and not serving again within the limit


class DrillRunner(Watchers, TargetLifecycle):
    def __init__(self, plan: DrillPlan, store: Store, *, override_env: bool = False, workdir: str | None = None,
                 run_id: str | None = None, hook: EventHook | None = None):
        self.plan = plan
        self.store = store
        self.warning = check_environment(plan.target, override_env)  # refuses before anything is touched
        self.run_id = run_id or new_run_id()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"vramlab-drill-{self.run_id}-"))
        self.hook = hook or EventHook()
        self.target = open_target(plan.target, self.workdir)
        self._t0 = time.perf_counter()
        self._round: int | None = None
        self._phase: str | None = None
        self._step: int | None = None
        self._balloon: Any = None
        self._cotenant: Any = None
        self._coloaded: CoLoaded | None = None
        self._started_target = False
        self.state = LiveState()
        self.detector = Detector(plan.stop, engine=self._engine())
        self.herd = HerdMonitor()
        self._last_health: bool | None = None
        self._step_started_s = 0.0
        self._last_log_event: dict[str, float] = {}
        self._ceiling_value: float | None = None
        self._coloc: Any = None
        self._step_counts = [0, 0]  # requests, errors of the running ramp step (its StepOutcome)
        self._baseline_tally: Any = None  # this round's baseline requests (experiment.baseline_check)
        self._ended_early: str | None = None
        self._ramp_tally: Any = None
        self._draining: asyncio.Future[Any] | None = None  # the failed step's window, its requests ending
        self._step_tally: Any = None  # the running ramp step's requests
        self.windows = WindowExecutor()  # the experiment runner's window executor, on this round's client
        self._unrecovered: list[int] = []
        self.health_path = plan.target.health_path  # replaced by what answered at bring-up (discover_health)
        self.load_time_s: float | None = None  # the first start's measured load time (start -> health 200)
        if plan.colocation is not None and isinstance(self.target, SimTarget):
            from vramlab.drill.colocation_run import ColocationRun

            self._coloc = ColocationRun(self, plan.colocation)

    # -- plumbing ---------------------------------------------------------------------------
    def _engine(self) -> str:
        t = self.plan.target
        engine: str = t.sim.engine if (t.kind == "sim" and t.sim) else t.engine
        return engine

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def emit(self, kind: str, message: str = "", payload: Any = None, **data: Any) -> None:
        self.hook.fire(Event(kind, self.now(), self._round, self._phase, self._step, message, data, payload))

    @property
    def device(self) -> str | None:
        return self.target.device if isinstance(self.target, SimTarget) else None

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> DrillResult:
        from vramlab.experiment.recorder import StoreRecorder

        self.recorder = StoreRecorder(self.store, flush_s=0.25)  # its accounting() says what was stored
        self.hook.add(self.recorder)
        plan = self.plan
        steps = RampSteps(plan.ramp)
        values = steps.values
        self._t0 = time.perf_counter()  # t_s = 0 is started_at: `vramlab note` stamps its notes the same way
        run = RunRecord(
            run_id=self.run_id, kind="drill", name=plan.name, plan=plan.model_dump(mode="json", by_alias=True),
            plan_hash=canonical_sha256(plan.model_dump(mode="json", by_alias=True)),
            fixed={"engine": self._engine(), "vramlab_version": _version(), "host": os.uname().nodename,
                   **({"model": plan.target.sim.model, "gpu_name": plan.target.sim.gpu} if plan.target.sim
                      else ({"model": plan.target.model} if plan.target.model else {}))},
            target={"kind": plan.target.kind, "environment": plan.target.environment,
                    "base_url": plan.target.base_url},
            change={"variable": plan.ramp.knob, "unit": plan.ramp.unit, "steps": values, "mode": plan.ramp.mode},
            started_at=time.time(), notes=[self.warning] if self.warning else [],
        )
        self.emit("run_start", f"drill {plan.name} ({self.run_id})", payload=run)
        if self.warning:
            self.emit("warning", self.warning)
        for line in plan.warnings():  # old field names the plan used, too few rounds
            self.emit("warning", line)
        failed_rounds: list[int] = []
        loop = asyncio.get_running_loop()
        body = asyncio.ensure_future(self._rounds(steps, failed_rounds))
        store_failure: list[str] = []

        def on_store_failure(why: str) -> None:  # the writer thread gave up: stop the load now, roll back
            def stop() -> None:
                store_failure.append(why)
                body.cancel()
            loop.call_soon_threadsafe(stop)

        self.recorder.on_failure = on_store_failure
        try:
            status, reason = await body
        except asyncio.CancelledError:
            if not store_failure or not body.cancelled():
                status, reason = "interrupted", "interrupted (Ctrl-C)"
                raise
            status, reason = "failed", store_failure[0]  # the CLI says what the store holds and exits 1
        except Exception as exc:
            status, reason = "failed", f"{type(exc).__name__}: {exc}"[:300]
            raise
        finally:
            self._phase, self._step = "rollback", None
            await self._rollback(status, reason)
            self.emit("run_end", reason or status, status=status, ended_at=time.time(), stop_reason=reason)
        return DrillResult(self.run_id, status, reason, failed_rounds, str(self.workdir), list(self._unrecovered))

    async def _rounds(self, steps: RampSteps, failed_rounds: list[int]) -> tuple[str, str | None]:
        """Bring the target up and run every round; (status, reason) of how they ended."""
        plan = self.plan
        await self._bring_up()
        self._plan_travels()
        for r in range(plan.rounds):
            self._round = r
            if await self._one_round(steps):
                failed_rounds.append(r)
            if self._ended_early is not None:  # a broken baseline, a silent ramp: the drill ends here, exit 1
                return "stopped", self._ended_early
            if self.detector.stopped is not None and self.detector.stopped.kind == "wall_clock_s":
                return "stopped", self.detector.stopped.message
        if not plan.prometheus_url:
            self._evaluate_alerts()
        return "completed", None

    async def _one_round(self, steps: RampSteps) -> bool:
        """One baseline, ramp, recovery cycle; True when the target failed in it."""
        from vramlab.load.client import OpenAIClient

        plan, values = self.plan, steps.values
        self._ceiling_value = None
        self.state = LiveState()
        self.detector = Detector(plan.stop, engine=self._engine())
        served = plan.target.model or (plan.target.sim.model if plan.target.sim else "default")
        conns = max(64, int(max(values)) + 8 if plan.ramp.knob in ("concurrency", "batch") else 64)
        async with OpenAIClient(self.target.url, served, api=plan.target.api, max_connections=conns,
                                timeout_s=plan.load.request_timeout_s) as client:
            self.windows.use(client)
            watchers = [asyncio.ensure_future(c) for c in self._watchers()]
            try:
                self._phase, self._step = "baseline", None
                self._baseline_tally = BaselineTally(plan.stop.error_rate)
                self.emit("phase_start", "baseline", phase="baseline")
                await self._window(None, plan.baseline_s, 0)
                self.emit("phase_end", "baseline")
                if self._check_baseline():
                    return False
                self._ramp_tally = BaselineTally(None)  # every ramp step's requests (what they got, in words)
                failure = await self._ramp(steps)
                if failure is not None and failure.kind == "wall_clock_s":
                    return False  # not a failure of the target; run() ends the drill as stopped
                came_back = self._ramp_tally.ok + self._ramp_tally.failed
                if failure is None and came_back == 0:
                    # a ramp that sent nothing (a burst too large to build), or whose requests never
                    # came back, held nothing: no ceiling claim
                    sent = self._ramp_tally.sent
                    why = ("the ramp sent no request" if not sent else
                           f"no ramp request came back ({sent} sent, all still open when their step ended)")
                    self._ended_early = f"{why}: no ceiling is claimed"
                    self.emit("stopped", self._ended_early, reason="no_load")
                    return False
                if failure is None:
                    top = values[-1] if self._ceiling_value is None else self._ceiling_value
                    why = "" if self._ceiling_value is None else " (the card was full: the co-tenant could not grow)"
                    self.emit("ceiling", f"no OOM up to {top:g} {plan.ramp.unit}{why}", value=top, unit=plan.ramp.unit)
                    return False
                await self._recover(failure, values)
                return True
            finally:
                await self._end_draining()
                for w in watchers:
                    w.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)

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

    def _check_baseline(self) -> bool:
        """True when the baseline breached its own error threshold: the drill stops before the ramp."""
        why = self._baseline_tally.broken() if self._baseline_tally is not None else None
        if why is None:
            return False
        from vramlab.drill.watch import last_error_line

        said = last_error_line(self.target)  # a local target's log: the engine's words when its answers had none
        self._ended_early = f"baseline broken, nothing ramped: {why}" + (f"; its log says: {said}" if said else "")
        self.emit("stopped", self._ended_early, reason="baseline")
        return True

    async def _ramp(self, steps: StepStrategy) -> Finding | None:
        """Step through the strategy's values until the target fails (or the drill's clock runs out)."""
        plan = self.plan
        self._phase = "ramp"
        i, v, last = 0, steps.first(), None
        while v is not None:
            self._step = i
            self._step_counts = [0, 0]
            self._step_tally = BaselineTally(None)
            self._step_started_s = self.now()
            self.emit("step", f"{plan.ramp.knob} = {v:g} {plan.ramp.unit}", step=i, value=v, knob=plan.ramp.knob)
            try:
                await self._apply(v)
            except CotenantOutOfMemory as exc:
                # the co-tenant, not the target, ran out: the card is full and the target held its memory
                self.emit("cotenant_oom", f"the co-tenant could not grow to {v:g} {plan.ramp.unit}: {exc}", value=v)
                self._ceiling_value = last
                return None
            task = asyncio.ensure_future(self._window(v, plan.ramp.step_s, i))
            try:
                while not task.done():
                    failure: Finding | None = self.detector.failure()
                    if failure is not None:
                        self._on_failure(failure, i, v, last)
                        if failure.kind != "wall_clock_s":
                            # the step sends nothing more; what it has in flight ends as what it is
                            # (a hung request times out), not "cancelled" by the move to recovery
                            self.windows.end()
                            self._draining, task = task, asyncio.ensure_future(asyncio.sleep(0))
                        return failure  # the recovery phase's load takes over from here (or the run ends)
                    await asyncio.sleep(0.02)
                await task
            finally:
                # on a stop or Ctrl-C the step's load ends here, before its client closes
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            failure = self.detector.failure()
            if failure is not None:
                self._on_failure(failure, i, v, last)
                return failure
            i, last = i + 1, v
            v = steps.next(StepOutcome(i, v, self._step_counts[0], self._step_counts[1], None, None))
        return None

    def _on_failure(self, f: Finding, step: int, value: float, last_safe: float | None) -> None:
        if f.kind == "wall_clock_s":
            # the drill's own time ran out: the target did not fail, so no fault, no recovery
            self.emit("stop_condition", f.message, condition=f.kind)
            self.emit("stopped", f"stopped by the wall clock during {self.plan.ramp.knob} = {value:g} "
                      f"{self.plan.ramp.unit}; {self._step_failures()} (last completed step: "
                      f"{'none' if last_safe is None else f'{last_safe:g}'})", value=value, last_completed=last_safe,
                      unit=self.plan.ramp.unit)
            return
        self.state.failed_at_s = self.state.failed_at_s or f.t_s
        if f.kind in ("wall_clock_s", "gpu_memory_share", "error_rate", "kv_usage", "p95_ms"):
            self.emit("stop_condition", f.message, condition=f.kind)
        self.emit("detect", f"detected: {f.message}", condition=f.kind, source=f.source)
        # T0 is the failure itself: its first evidence (a failed request's end, the exit, the OOM line)
        t0 = self.detector.first_evidence_s()
        self.emit("fault", f"failed during {self.plan.ramp.knob} = {value:g} {self.plan.ramp.unit}", step=step,
                  value=value, knob=self.plan.ramp.knob, unit=self.plan.ramp.unit, step_started_s=self._step_started_s,
                  t0_s=t0 if t0 is not None else f.t_s, last_safe_value=last_safe, mode=self.detector.failure_mode(),
                  evidence=self.detector.evidence(), signature=self.detector.signature())

    def _step_failures(self) -> str:
        """What the running step's requests got, for the wall-clock stop's line: never "nothing had
        failed" over requests the server refused (a 400 for the context length is a failure too)."""
        tally = self._step_tally
        if tally is None or tally.sent == 0:
            return "nothing had failed (no request of the step had ended yet)"
        if not tally.failed:
            return "nothing had failed"
        classes = ", ".join(f"{k} {v}" for k, v in sorted(tally.classes.items()))
        return (f"{tally.failed} of {tally.ok + tally.failed} of its requests had failed ({classes})"
                + (f"; the server said: {tally.first_error}" if tally.first_error else ""))

    async def _recover(self, failure: Finding, values: list[float]) -> None:
        plan = self.plan
        self._phase = "recovery"
        step = self._step or 0
        # undo: back to the baseline load (so "P95 back to baseline" compares like with like);
        # otherwise the failing step's load stays on, which tests for a second OOM
        value: float | None = None if plan.recovery.undo_ramp else values[step]
        if plan.recovery.undo_ramp:
            await self._apply(None)
            self.emit("ramp_undone", "load back to the baseline", value=None)
        ex = WindowExecutor()  # the failed step's window may still be draining on self.windows
        ex.use(self.windows.client)
        load = asyncio.ensure_future(self._window(value, plan.recovery.limit_s + plan.recovery.observe_s + 5, step, ex))
        try:
            out = await recover(plan.recovery, self.target, self.state, self.now, self.emit,
                                operator_notes=self._notes_since,
                                supervised_by_drill=plan.target.kind in ("sim", "process"),
                                startup_allowance_s=self.startup_allowance_s(), on_restart=self.detector.on_restart)
            if out.recovered:
                t0 = self.detector.first_evidence_s()
                t0 = t0 if t0 is not None else (failure.t_s or 0.0)
                # not yet the verdict: that also wants health 200 and P95 back over the observation window
                self.emit("recovered", f"serving again {(out.served_again_s or 0.0) - t0:.2f} s after T0 (a successful "
                          f"request); the verdict follows the {plan.recovery.observe_s:g} s observation",
                          served_again_s=out.served_again_s)
                await asyncio.sleep(plan.recovery.observe_s)
            else:
                self._unrecovered.append(self._round or 0)
                self.emit("not_recovered", out.reason, limit_s=plan.recovery.limit_s)
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
            # settle the fault's mode now that recovery showed more (a refusal on restart, ...)
            mode, evidence = self.detector.failure_mode(), self.detector.evidence()
            self.emit("failure_mode", f"failure mode {mode}" + (f": {evidence[0]}" if evidence else ""), mode=mode,
                      evidence=evidence, signature=self.detector.signature())
            self.emit("phase_end", "recovery")

    def _plan_travels(self) -> None:
        """The capacity plan for the target's own settings and its start-up memory, stored as events."""
        from vramlab.drill.capacity_plan import facts_for_drill, start_events

        log = getattr(self.target, "log_path", None)
        for kind, message, data in start_events(facts_for_drill(self.plan, str(log) if log else None)):
            self.emit("warning" if kind == "note" else kind, message, **data)

    def _notes_since(self, t_s: float) -> list[str]:
        evs = self.store.events(self.run_id)
        return [e.message for e in evs if e.kind == "note" and e.t_s >= t_s]

    async def _apply(self, value: float | None) -> None:
        """Turn the ramp's knob to *value* (None: back to the plan's own load)."""
        knob = self.plan.ramp.knob
        if knob == "balloon":
            if self._balloon is None:
                self._balloon = self._make_balloon()
            await asyncio.to_thread(self._balloon.set_bytes, int((value or 0) * GIB))
        elif knob == "coloaded_model":
            if self.device is None or not self.plan.target.sim:
                from vramlab.errors import ConfigError

                raise ConfigError("ramp.knob coloaded_model needs a sim target (real co-loading: use target commands)")
            if self._coloaded is None:
                settings = (self._coloc and self._coloc.coloaded_settings()) or self.plan.target.sim.model_copy(
                    update={"model": self.plan.ramp.model or self.plan.target.sim.model})
                self._coloaded = CoLoaded(self.device, settings, self.workdir)
            if value is not None:
                t = time.monotonic()
                await asyncio.to_thread(self._coloaded.set_count, int(value))
                if self._coloc is not None:
                    self._coloc.report_coloaded(self._coloaded, time.monotonic() - t)

    # -- load -------------------------------------------------------------------------------
    async def _window(self, value: float | None, duration_s: float, step: int, ex: WindowExecutor | None = None) -> None:
        from vramlab.load.driver import LoadShape, Window
        from vramlab.load.prompts import synthetic_prompts
        from vramlab.load.retry import RetryPolicy

        plan, knob = self.plan, self.plan.ramp.knob
        prompt_tokens = int(value) if (knob == "context" and value) else plan.load.prompt_tokens
        users = int(value) if (knob == "concurrency" and value) else plan.load.concurrency
        phase, rnd = self._phase or "ramp", self._round or 0
        prompts = synthetic_prompts(prompt_tokens, plan.load.max_tokens, 64, seed=rnd * 1000 + step)
        retry = RetryPolicy(**plan.clients.model_dump())
        window = Window(duration_s=duration_s, drain_s=min(1.0, plan.load.request_timeout_s))

        def record(res: Any, user: int) -> None:
            self._on_result(res, phase, rnd, step, value, user)

        def recorder_for(user: int) -> Any:
            return lambda res: record(res, user)

        tag = "b" if phase == "baseline" else ("r" if phase == "recovery" else "s")
        # one lane per closed-loop user (each its own seed and request ids), all in one window
        cap = PROBE_RESOLUTION_S if phase == "recovery" else None  # recovery is timed to this, not to a back-off
        lanes = [Lane(prompts, LoadShape(mode="closed", concurrency=1, max_tokens=plan.load.max_tokens, seed=u,
                                         think_s=plan.load.think_time_s, error_backoff_max_s=cap), window, recorder_for(u), f"u{u}:{rnd}{tag}{step}-")
                 for u in range(users)]
        if knob == "batch" and value and phase == "ramp":
            # a burst of `value` simultaneous requests at the start of the step, on top of the steady users
            burst = Window(requests=int(value), max_s=duration_s, drain_s=window.drain_s)
            lanes.append(Lane(prompts, LoadShape(mode="closed", concurrency=int(value), max_tokens=plan.load.max_tokens),
                              burst, recorder_for(10_000), f"burst:{rnd}{step}-"))
        await (ex or self.windows).run(lanes, retry, end_drain_s=plan.load.request_timeout_s + 0.5)

    def _on_result(self, res: Any, phase: str, rnd: int, step: int, value: float | None, user: int) -> None:
        if res.error_class == "cancelled" and self.state.failed_at_s is not None:
            import dataclasses

            res = dataclasses.replace(res, error=f"still open when the drill's {phase} load ended: neither answered "
                                      "nor timed out by then")
        # the detector reads how long a failed request took (a timeout), so failures keep their latency
        rec = request_record(res, self.run_id, self._t0, rnd, phase if phase in ("baseline", "recovery") else "ramp",
                             step, value, failed_latency=True)
        self.emit("request", payload=rec)
        end = rec.end_s or self.now()
        if phase == "baseline" and self._baseline_tally is not None:
            self._baseline_tally.add(rec.ok, rec.error_class, rec.status_code, rec.error)
        if phase == "ramp" and self._step_tally is not None:
            self._step_tally.add(rec.ok, rec.error_class, rec.status_code, rec.error)
            self._ramp_tally.add(rec.ok, rec.error_class, rec.status_code, rec.error)
        if res.error_class == "cancelled":
            return
        if phase == "ramp":
            self._step_counts[0] += 1
            self._step_counts[1] += not rec.ok
        if rec.ok:
            self.state.last_success_s = end
        self.detector.on_result(end, rec.ok, rec.status_code, rec.error_class, rec.error, rec.e2e_from_scheduled_ms)
        amp = self.herd.on_attempt(rec.sent_s or end, phase, rec.attempt)
        if amp is not None:
            self.emit("retry_storm", f"attempt rate {amp:.1f}x the baseline's offered rate in one "
                      f"{self.herd.window_s:g} s window of recovery, mostly retries (live; the report judges the "
                      "whole recovery window)", amplification=amp, window_s=self.herd.window_s)

    # -- alerts evaluated on the drill's own samples ----------------------------------------
    def _evaluate_alerts(self) -> None:
        from vramlab.drill.alerting import evaluate_rules

        samples = self.store.samples(self.run_id)
        requests = self.store.requests(self.run_id)
        for ev in evaluate_rules(self.plan.alerts, samples, requests):
            self.hook.fire(Event("alert", ev["t_s"], None, None, None, f"{ev['name']} {ev['state']}", ev))



def _version() -> str:
    from vramlab import __version__

    return __version__


__all__ = ["DrillResult", "DrillRunner"]
