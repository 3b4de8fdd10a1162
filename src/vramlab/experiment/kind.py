"""The experiment, a kind of run the one runner (run/runner.py) runs: baseline, fixed treatment
steps and a recovery window per round, the same window each; the plan's stop conditions
(``StopMonitor``, run/stop.py, the one stop engine the drill's detector uses too); its rollback
commands.

Every request and sample goes out as an event (records in small bursts, see ``RECORD_EVERY_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramlab.experiment.plan import Plan
from vramlab.experiment.wiring import (
    prompts_for,
    retry_for,
    samplers_for,
    shape_for,
    window_for,
)
from vramlab.load.client import OpenAIClient, RequestResult
from vramlab.load.prompts import Prompt, PromptMaker
from vramlab.observe.base import Sample, Sampler, SamplerSet
from vramlab.records import RunRecord, SampleRecord, canonical_sha256, new_run_id
from vramlab.records import emit as E
from vramlab.records.emit import Draft
from vramlab.records.stats import percentile
from vramlab.run.baseline_check import BaselineTally
from vramlab.run.capacity_plan import PlanFacts, target_facts
from vramlab.run.kind import Where
from vramlab.run.rollback import RollbackResult, run_rollbacks
from vramlab.run.steps import FixedSteps, StepOutcome, StepStrategy
from vramlab.run.stop import StopMonitor, StopReason
from vramlab.run.window import Lane, WindowExecutor, request_record

if TYPE_CHECKING:
    from vramlab.experiment.search import SearchSteps
    from vramlab.run.runner import Runner

_SOURCES = {"gpu", "ledger", "engine", "prometheus", "host", "health", "ollama"}


@dataclass
class RunOptions:
    rounds: int | None = None
    kind: str = "experiment"
    base_dir: Path = Path(".")
    api_key: str | None = None  # read from the environment by the caller; never stored
    strategy: StepStrategy | None = None
    samplers: list[Sampler] | None = None  # None: the plan's own
    capture_environment: bool = True
    run_id: str | None = None
    extra_fixed: dict[str, Any] = field(default_factory=dict)
    workers: int | None = (
        None  # load worker processes; None: one per core when the plan needs more than a core
    )


@dataclass
class _WindowStats:
    requests: int = 0
    errors: int = 0
    e2e: list[float] = field(default_factory=list)
    results: list[RequestResult] = field(default_factory=list)  # turned into records in bursts (below)
    flushed_at: float = field(default_factory=time.perf_counter)
    where: tuple[int, str, int, float] = (0, "baseline", 0, 0.0)  # round, phase, step, value

    def p(self, q: float) -> float | None:
        """The window's e2e percentile (q in 0-1) by the one definition the stops and reports use."""
        return percentile(self.e2e, q * 100) if self.e2e else None


class ExperimentKind:
    """A plan's experiment: each round a baseline window, a window per treatment step, a recovery window."""

    step_phase = "treatment"

    def __init__(self, plan: Plan, options: RunOptions | None = None) -> None:
        options = options or RunOptions()
        self.plan = plan
        self.o = options
        self.rounds = range(1, (options.rounds or plan.rounds) + 1)
        self._search: SearchSteps | None = None  # change.search: each treatment window a probe
        if options.strategy is None and plan.change.search is not None:
            from vramlab.experiment.search import SearchSteps

            self._search = SearchSteps(plan, lambda draft: self.run.emit(draft))
        self.strategy = options.strategy or self._search or FixedSteps(plan.change.values())
        self.monitor = StopMonitor(plan.stop_conditions, plan.wall_clock_s())
        self.wall_clock_s = self.monitor.wall_clock_s
        self.run_id = options.run_id or new_run_id()
        self.windows = WindowExecutor()  # runs each window; the drill's parts use the same executor
        self._prompts: dict[float, list[Prompt]] = {}
        self._client: OpenAIClient | None = None
        self._maker: PromptMaker | None = None
        self._pool: Any = None  # a WorkerPool when the load runs in several processes
        self.workers = 1
        self._totals = [0, 0]
        self._last_4xx: str | None = None
        self._baseline: BaselineTally | None = None  # the running baseline's requests (baseline_check)
        self._env_notes: list[str] = []
        self._outcome: StepOutcome | None = None  # the last treatment step's
        self._trace_noted = False

    def attach(self, run: Runner) -> None:
        self.run = run

    # -- the run's start -----------------------------------------------------------------------
    async def record(self) -> tuple[str, RunRecord]:
        plan, n = self.plan, len(self.rounds)
        fixed, self._env_notes = await self._environment()
        record = RunRecord(
            run_id=self.run_id,
            kind=self.o.kind,
            name=plan.name,
            plan=plan.model_dump(mode="json"),
            plan_hash=canonical_sha256(
                {
                    "fixed": plan.fixed.model_dump(mode="json"),
                    "model": plan.target.model,
                    "api": plan.target.api,
                    "load": plan.load.model_dump(mode="json"),
                    "phases": plan.phases.model_dump(mode="json"),
                }
            ),
            fixed=fixed,
            target={
                "base_url": plan.target.base_url,
                "api": plan.target.api,
                "model": plan.target.model,
                "kind": plan.target.kind,
                "environment": plan.target.environment,
            },
            change={
                "variable": plan.change.variable,
                "baseline": plan.baseline_value(),
                "steps": plan.change.values(),
                "rounds": n,
            },
            started_at=time.time(),
        )
        return f"run {self.run_id} {plan.name!r}: {n} round{'s' if n != 1 else ''}", record

    async def started(self) -> None:
        for n in [*self.plan.warnings(), *self._env_notes]:
            self.run.note(n)
        if self.o.rounds is not None and self.o.rounds < 3 and self.plan.rounds >= 3:
            self.run.note(f"rounds: {self.o.rounds} (from --rounds) is fewer than 3")

    def capacity_facts(self) -> PlanFacts:
        """The target's settings for the capacity plan: its sim's, else the plan's capacity: block."""
        tg = self.plan.target
        return target_facts(tg.model, tg.kind, tg.sim, self.plan.capacity, tg.log_file)

    async def _environment(self) -> tuple[dict[str, Any], list[str]]:
        from vramlab.experiment.environment import engine_facts, gpu_facts, host_facts

        fixed: dict[str, Any] = {
            "engine": self.plan.target.kind,
            "model": self.plan.target.model,
            **host_facts(),
        }
        notes: list[str] = []
        if self.o.capture_environment:
            fixed.update(await asyncio.to_thread(gpu_facts))
            headers = {"Authorization": f"Bearer {self.o.api_key}"} if self.o.api_key else {}
            facts, notes = await engine_facts(self.plan.target.url, headers, self.plan.target.model)
            fixed.update(facts)
        fixed.update(self.o.extra_fixed)
        return fixed, notes

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        """The load client (or worker processes) and the samplers, for every round."""
        from vramlab.experiment.load_setup import open_load

        self._client, self._pool, self.workers = await open_load(self.plan, self.o, stack, self.run.note)
        self._maker = await self._prompt_maker(stack)
        self.windows.use(self._client, self._pool, self.workers)
        samplers = SamplerSet(
            self.o.samplers if self.o.samplers is not None else samplers_for(self.plan),
            self.plan.samplers.interval_s,
            self._on_samples,
            self.run.note,
            self.run.emit,
        )
        await samplers.start()
        stack.push_async_callback(samplers.stop)

    async def _prompt_maker(self, stack: contextlib.AsyncExitStack) -> PromptMaker | None:
        """Synthetic and trace prompts sized in the target's tokenizer (load/tokens.py), said in a note."""
        if self.plan.fixed.input.synthetic is None and self.plan.fixed.input.trace is None:
            return None
        from vramlab.load.tokens import open_prompt_maker

        t = self.plan.target
        local = self.plan.capacity.model if self.plan.capacity else None  # a model directory's tokenizer.json
        maker, note = await open_prompt_maker(
            stack, t.url, t.model, t.api, self.o.api_key, self.plan.load.request_timeout_s, local
        )
        self.run.note(note)
        return maker

    # -- the phases ------------------------------------------------------------------------------
    def round(self, rnd: int) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def baseline(self, rnd: int) -> None:
        await self._phase(rnd, "baseline", 0, self.plan.baseline_value())

    def steps(self) -> StepStrategy:
        return self.strategy

    def begin_step(self, step: int, value: float) -> None:
        self._outcome = None  # the treatment is the window's load shape: nothing to set before it

    async def apply(self, value: float) -> bool:
        return True

    async def window(self, rnd: int, step: int, value: float) -> None:
        self._outcome = await self._phase(rnd, "treatment", step, value)

    def step_failed(self) -> bool:
        return False  # a stop condition ends the window itself (fire_stop) and the run after it

    def on_step_failure(
        self, step: int, value: float, last: float | None, window: asyncio.Future[Any] | None
    ) -> bool:
        return False

    def end_step(self, step: int, value: float) -> StepOutcome:
        assert self._outcome is not None, "a treatment step ended without its window's outcome"
        return self._outcome

    async def steps_held(self, rnd: int) -> None:
        pass  # a stop condition, not the steps, ends an experiment early

    async def recovery(self, rnd: int, failed: bool) -> None:
        await self._phase(rnd, "recovery", 0, self.plan.baseline_value())

    def after_rounds(self) -> None:
        pass

    async def _phase(self, rnd: int, phase: str, step: int, value: float) -> StepOutcome:
        plan, var, n = self.plan, self.plan.change.variable, len(self.rounds)
        if value not in self._prompts:
            self._prompts[value] = await prompts_for(plan, value, self.o.base_dir, self._maker)
        seed = (plan.fixed.input.synthetic.seed if plan.fixed.input.synthetic else 0) * 1000 + step
        shape = shape_for(plan, value, seed, await self._schedule(value))
        stats = _WindowStats(where=(rnd, phase, step, value))
        at = f"round {rnd}/{n} {phase}" + (f" step {step}" if step else "")
        self.run.emit(E.PHASE_START(f"{at}: {var} = {value:g}", {"variable": var, "value": value}))

        def on_result(res: RequestResult) -> None:
            self._on_request(res, stats)

        lane = Lane(
            self._prompts[value],
            shape,
            window_for(plan, self.monitor.wall_clock_s - self.run.now(), phase),
            on_result,
            f"{rnd}{phase[0]}{step}-",
        )
        self._baseline = BaselineTally(plan.stop_conditions.error_rate) if phase == "baseline" else None
        try:
            outcome = await self.windows.run([lane], retry_for(plan))
        finally:
            self._flush_records(stats)
        broken = self._baseline.broken() if self._baseline is not None else None
        if (
            broken is not None and self.run.stop is None
        ):  # a change measured against this would measure nothing
            self.fire_stop(
                StopReason(
                    "baseline",
                    1.0,
                    plan.stop_conditions.error_rate or 1.0,
                    f"baseline broken, nothing changed: {broken}",
                )
            )
        lag_p99, lag = None, []
        if outcome is not None:
            lag_p99 = outcome.lag_p99_ms
            lag = self.windows.client_lag(outcome, plan.load.lag_warn_ms)
        saturated = [w for w in lag if w["saturated"]]
        p50, p95 = stats.p(0.5), stats.p(0.95)
        self.run.emit(
            E.PHASE_END(
                f"{at}: {stats.requests} requests, {stats.errors} errors"
                + (f", P95 {p95:.0f} ms" if p95 is not None else ""),
                {
                    "variable": var,
                    "value": value,
                    "requests": stats.requests,
                    "errors": stats.errors,
                    "p50_e2e_ms": p50,
                    "p95_e2e_ms": p95,
                    "dispatch_lag_p99_ms": lag_p99,
                    "client_saturated": bool(saturated),
                    "client_lag": lag,
                },
            )
        )
        for w in saturated:
            self.run.emit(
                E.WARNING(
                    f"the load generator fell behind in round {rnd} {phase}"
                    + (f" step {step}" if step else "")
                    + f": {w['name']} saturated (dispatch lag "
                    f"P99 {w['dispatch_lag_p99_ms']:.1f} ms, event-loop lag P99 {w['loop_lag_p99_ms']:.1f} ms > "
                    f"{plan.load.lag_warn_ms:g} ms); this window's latencies include the client's own lag "
                    "(latencies from the scheduled time still count it; the offered load was lower than "
                    "planned" + ("" if self.workers > 1 else "; more load workers: --workers") + ")",
                    {
                        "dispatch_lag_p99_ms": w["dispatch_lag_p99_ms"],
                        "loop_lag_p99_ms": w["loop_lag_p99_ms"],
                        "worker": w["worker"],
                        "pid": w["pid"],
                        "client_saturated": True,
                    },
                )
            )
        return StepOutcome(step, value, stats.requests, stats.errors, p95, self.run.stop)

    async def _schedule(self, value: float) -> tuple[float, ...] | None:
        """A trace's send times for this window (None: the load's arrival process); its note once."""
        if self.plan.fixed.input.trace is None:
            return None
        from vramlab.experiment.wiring import trace_input, trace_schedule

        trace, _, note = await trace_input(self.plan, self.o.base_dir, self._maker)
        if not self._trace_noted:
            self._trace_noted = True
            self.run.note(note)
        return trace_schedule(trace, self.plan, value)

    # -- inputs from the load and the samplers --------------------------------------------------
    # A window's results become records in small bursts: every RECORD_EVERY_S (so a crash or SIGKILL
    # loses at most about half a second with the writer's own flush, and a store that refuses rows
    # is noticed within seconds, not a window later), or past PENDING_MAX results (memory). A record
    # costs ~30 us to build on a loaded 2-core box, so a burst at 3,000 requests/s holds the loop
    # ~9 ms (the store writer's thread does the writing). Holding them to the window's end instead
    # made bursts of PENDING_MAX x 30 us = 0.6 s and lost the whole window on a SIGKILL.
    PENDING_MAX = 20_000
    RECORD_EVERY_S = 0.1

    def _on_request(self, res: RequestResult, stats: _WindowStats) -> None:
        t0, ok = self.run.t0, res.ok
        stats.results.append(res)
        if self._baseline is not None:
            self._baseline.add(ok, res.error_class, res.status_code, res.error)
        if len(stats.results) >= self.PENDING_MAX or res.end_at - stats.flushed_at >= self.RECORD_EVERY_S:
            self._flush_records(stats)
        if res.error_class != "cancelled":
            stats.requests += 1
            self._totals[0] += 1
            if ok:
                stats.e2e.append(res.e2e_from_scheduled_ms)
            else:
                stats.errors += 1
                self._totals[1] += 1
                if res.error_class == "http_4xx" and res.error:
                    self._last_4xx = res.error
        self.monitor.on_request(res.end_at - t0, ok, res.error_class, res.e2e_from_scheduled_ms, res.error)
        if not ok:
            self.tick()

    def _flush_records(self, stats: _WindowStats) -> None:
        """Turn the window's results into records and hand them to the store writer, in one go."""
        results, stats.results = stats.results, []
        stats.flushed_at = time.perf_counter()
        rnd, phase, step, value = stats.where
        t0, run_id, emit, where = self.run.t0, self.run_id, self.run.emit, Where(rnd, phase, step)
        for res in results:
            rec = request_record(res, run_id, t0, rnd, phase, step, value)
            emit(E.request(rec), rec.end_s or 0.0, where)
            if self._search is not None:
                self._search.add(rec)

    def _on_samples(self, samples: list[Sample]) -> None:
        recs = []
        for s in samples:
            self.monitor.on_sample(s.name, s.value, s.source + ":" + s.labels.get("gpu", ""))
            if s.source in _SOURCES:
                recs.append(
                    SampleRecord(
                        run_id=self.run_id,
                        t_s=s.t - self.run.t0,
                        source=s.source,
                        name=s.name,
                        value=s.value,
                        labels=dict(s.labels),
                    )
                )
        if recs:
            self.run.emit(E.samples(recs), recs[0].t_s)
        self.tick()

    def tick(self) -> None:
        """The stop conditions, on a request's failure, a sample and every polling interval."""
        if self.run.stop is None:
            reason = self.monitor.check(self.run.now())
            if reason is not None:
                self.fire_stop(reason)

    def fire_stop(self, reason: StopReason) -> None:
        """Stop now: record why and end the running window."""
        if self.run.stop is not None:
            return
        if reason.condition == "error_rate" and self._last_4xx:
            # The server's own words for the 4xx behind the error rate: console, run row, every report.
            reason = dataclasses.replace(
                reason, message=f"{reason.message}; the server said: {self._last_4xx}"
            )
        self.run.halt(reason.message, reason)
        self.windows.stop()  # every loop, in every worker, sends nothing more from here on
        self.run.emit(
            E.STOP_CONDITION(
                reason.message,
                {"condition": reason.condition, "value": reason.value, "threshold": reason.threshold},
            )
        )

    # -- the end -----------------------------------------------------------------------------------
    async def rollback(self, status: str, reason: str | None) -> list[RollbackResult]:
        if not self.plan.rollback:
            return []
        env = {
            "VRAMLAB_RUN_ID": self.run_id,
            "VRAMLAB_RUN_STATUS": status,
            "VRAMLAB_STOP_REASON": reason or "",
        }

        def on_result(r: RollbackResult) -> None:
            state = "ok" if r.ok else ("timed out" if r.exit_code is None else f"exit {r.exit_code}")
            self.run.emit(
                E.ROLLBACK(
                    f"rollback {r.command!r}: {state} in {r.duration_s:.1f} s",
                    {
                        "command": r.command,
                        "exit_code": r.exit_code,
                        "duration_s": r.duration_s,
                        "output_tail": r.output_tail,
                    },
                )
            )

        return await run_rollbacks(self.plan.rollback, env, on_result)

    def run_end(self, status: str, reason: str | None) -> Draft:
        return E.RUN_END(
            f"run {self.run_id} {status}" + (f": {reason}" if reason else ""),
            {
                "status": status,
                "ended_at": time.time(),
                "stop_reason": reason,
                "requests": self._totals[0],
                "errors": self._totals[1],
            },
        )

    def totals(self) -> tuple[int, int]:
        return self._totals[0], self._totals[1]


__all__ = ["ExperimentKind", "RunOptions"]
