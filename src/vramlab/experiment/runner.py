"""The experiment runner: rounds of baseline -> treatment steps -> recovery, the same window each.

It owns the clock, the stop conditions and the order of things; everything it learns goes out as
events (see events.py) to whoever subscribes: the store writer, the terminal, a test. The stop
conditions are ``StopMonitor`` (stop.py), the one stop engine the drill's detector uses too.

However the run ends (completed, a stop condition, an error, Ctrl-C), the same ``finally`` stops
the samplers and runs the rollback commands, then emits ``run_end``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlab.experiment.baseline_check import BaselineTally
from vramlab.experiment.events import Event, EventHook
from vramlab.experiment.plan import Plan
from vramlab.experiment.rollback import RollbackResult, run_rollbacks
from vramlab.experiment.steps import FixedSteps, StepOutcome, StepStrategy
from vramlab.experiment.stop import StopMonitor, StopReason
from vramlab.experiment.window import Lane, WindowExecutor, request_record
from vramlab.experiment.wiring import (
    max_connections,
    prompts_for,
    retry_for,
    samplers_for,
    shape_for,
    window_for,
)
from vramlab.load.client import OpenAIClient, RequestResult
from vramlab.load.prompts import Prompt
from vramlab.observe.base import Sample, Sampler, SamplerSet
from vramlab.records import RunRecord, SampleRecord, canonical_sha256, new_run_id
from vramlab.records.stats import percentile

EXIT_CODES = {"completed": 0, "failed": 1, "stopped": 3, "interrupted": 130}
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
    workers: int | None = None  # load worker processes; None: one per core when the plan needs more than a core
    # called once at the start with the plan; each returns (event kind, message, data) to emit ("note": a note),
    # e.g. the capacity plan for the target's own settings (vramlab.drill.capacity_plan, wired by cli/run.py)
    start_hooks: list[Callable[[Plan], list[tuple[str, str, dict[str, Any]]]]] = field(default_factory=list)


@dataclass(frozen=True)
class RunResult:
    run_id: str
    status: str
    stop_reason: StopReason | None
    notes: tuple[str, ...]
    requests: int
    errors: int
    elapsed_s: float
    rollbacks: tuple[RollbackResult, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


class _Stopped(Exception):
    pass


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


class Runner:
    def __init__(self, plan: Plan, hook: EventHook | None = None, options: RunOptions | None = None) -> None:
        self.plan = plan
        self.hook = hook or EventHook()
        self.o = options or RunOptions()
        self.rounds = self.o.rounds or plan.rounds
        self.strategy = self.o.strategy or FixedSteps(plan.change.values())
        self.monitor = StopMonitor(plan.stop_conditions, plan.wall_clock_s())
        self.run_id = self.o.run_id or new_run_id()
        self.stop: StopReason | None = None
        self.notes: list[str] = []
        self.t0 = time.perf_counter()
        self._where: tuple[int | None, str | None, int | None] = (None, None, None)
        self.windows = WindowExecutor()  # runs each window; the drill's runner uses the same executor
        self._prompts: dict[float, list[Prompt]] = {}
        self._client: OpenAIClient | None = None
        self._pool: Any = None  # a WorkerPool when the load runs in several processes
        self.workers = 1
        self._totals = [0, 0]
        self._abort: str | None = None
        self._last_4xx: str | None = None
        self._baseline: BaselineTally | None = None  # the running baseline's requests (baseline_check)

    # -- events --------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, kind: str, message: str = "", data: dict[str, Any] | None = None, payload: Any = None) -> None:
        r, ph, st = self._where
        self.hook.fire(Event(kind, self.now(), r, ph, st, message, data or {}, payload))

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.emit("note", message)

    # -- the run -------------------------------------------------------------------------------
    async def run(self) -> RunResult:
        plan = self.plan
        self.t0 = time.perf_counter()
        started_at = time.time()
        fixed, env_notes = await self._environment()
        record = RunRecord(
            run_id=self.run_id, kind=self.o.kind, name=plan.name, plan=plan.model_dump(mode="json"),
            plan_hash=canonical_sha256({"fixed": plan.fixed.model_dump(mode="json"), "model": plan.target.model,
                                        "api": plan.target.api, "load": plan.load.model_dump(mode="json"),
                                        "phases": plan.phases.model_dump(mode="json")}),
            fixed=fixed, target={"base_url": plan.target.base_url, "api": plan.target.api, "model": plan.target.model,
                                 "kind": plan.target.kind, "environment": plan.target.environment},
            change={"variable": plan.change.variable, "baseline": plan.baseline_value(),
                    "steps": plan.change.values(), "rounds": self.rounds},
            started_at=started_at)
        self.emit("run_start", f"run {self.run_id} {plan.name!r}: {self.rounds} round{'s' if self.rounds != 1 else ''}", payload=record)
        for n in [*plan.warnings(), *env_notes]:
            self.note(n)
        if self.o.rounds is not None and self.o.rounds < 3 and plan.rounds >= 3:
            self.note(f"rounds: {self.o.rounds} (from --rounds) is fewer than 3")
        await self._start_hooks()
        status, reason_text = "failed", None
        samplers = SamplerSet(self.o.samplers if self.o.samplers is not None else samplers_for(plan),
                              plan.samplers.interval_s, self._on_samples, self.note, self.emit)
        ticker: asyncio.Task[None] | None = None
        rollbacks: list[RollbackResult] = []
        try:
            async with contextlib.AsyncExitStack() as stack:
                await self._open_load(stack)
                self.windows.use(self._client, self._pool, self.workers)
                await samplers.start()
                ticker = asyncio.ensure_future(self._tick())
                await self._rounds()
            status = "stopped" if self.stop is not None else "completed"
        except _Stopped:
            status = "stopped"
        except asyncio.CancelledError:
            status = "interrupted"
            reason_text = "interrupted (Ctrl-C or SIGTERM)"
        except Exception as exc:  # recorded on the run, then raised to the caller as a one-line error
            status = "failed"
            reason_text = f"{type(exc).__name__}: {exc}"[:300]
            self._where = (None, None, None)
            self.emit("error", reason_text)
        finally:
            if self._abort is not None:
                status, reason_text = "failed", self._abort
            self._where = (None, None, None)
            if ticker is not None:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
            await samplers.stop()
            if self.stop is not None and reason_text is None:
                reason_text = self.stop.message
            rollbacks = await self._rollback(status, reason_text)
            for err in self.hook.errors:
                self.note(err)
            self.hook.errors.clear()
            self.emit("run_end", f"run {self.run_id} {status}" + (f": {reason_text}" if reason_text else ""),
                      {"status": status, "ended_at": time.time(), "stop_reason": reason_text,
                       "requests": self._totals[0], "errors": self._totals[1]})
        return RunResult(self.run_id, status, self.stop, tuple(self.notes), self._totals[0], self._totals[1],
                         self.now(), tuple(rollbacks))

    async def _start_hooks(self) -> None:
        for hook in self.o.start_hooks:
            try:
                emitted = await asyncio.to_thread(hook, self.plan)
            except Exception as exc:
                self.note(f"start hook: {type(exc).__name__}: {exc}"[:300])
                continue
            for kind, message, data in emitted:
                self.note(message) if kind == "note" else self.emit(kind, message, data)

    async def _engine_accepts_ignore_eos(self) -> bool:
        """`ignore_eos` is not in OpenAI's API: vLLM, SGLang and llama.cpp accept it, others answer 4xx
        (e.g. `HTTP 422: Unexpected fields in the request: {'ignore_eos'}`). One request of one token
        with it: a 4xx naming the field drops it for the run, with a note quoting the server."""
        from vramlab.load.prompts import Prompt

        plan = self.plan
        async with OpenAIClient(plan.target.url, plan.target.model, plan.target.api, self.o.api_key,
                                max_connections=1, timeout_s=plan.load.request_timeout_s, ignore_eos=True) as probe:
            res = await probe.send("ignore-eos-probe", Prompt("Say OK.", None, 1), 1, time.perf_counter())
        if 400 <= res.status_code < 500 and "ignore_eos" in (res.error or ""):
            self.note(f"ignore_eos dropped: the server refused the field ({res.error}); outputs may end before "
                      "output_tokens")
            return False
        return True

    async def _open_load(self, stack: contextlib.AsyncExitStack) -> None:
        """The load client: in this process, or a pool of worker processes (see load/workers.py)."""
        from vramlab.load.workers import ClientConfig, WorkerPool, workers_needed

        plan = self.plan
        conns = max_connections(plan, plan.change.values())
        rate = plan.load.request_rate
        if plan.change.variable == "request_rate":
            rate = max([rate or 0.0, *plan.change.values()])
        n = self.o.workers if self.o.workers is not None else workers_needed(conns, rate if plan.load.mode == "open"
                                                                             else None)
        if n < 1:
            raise ValueError("workers must be at least 1")
        cfg = ClientConfig(plan.target.url, plan.target.model, plan.target.api, self.o.api_key,
                           max_connections=conns, timeout_s=plan.load.request_timeout_s,
                           ignore_eos=plan.fixed.ignore_eos and await self._engine_accepts_ignore_eos(),
                           http_client=plan.load.http_client)
        if n == 1:
            self._client = await stack.enter_async_context(OpenAIClient(
                cfg.base_url, cfg.model, cfg.api, cfg.api_key, max_connections=cfg.max_connections,
                timeout_s=cfg.timeout_s, ignore_eos=cfg.ignore_eos, http_client=cfg.http_client))
            self.note(f"load: HTTP client {self._client.http_client}"
                      f"{' (kernel receive stamps)' if self._client.http_client == 'fast' else ''}")
            return
        self._pool = await stack.enter_async_context(WorkerPool(n, cfg))
        self.workers = n
        self.note(f"load: {n} worker processes (pids {', '.join(map(str, self._pool.pids))}), one schedule; "
                  f"{'--workers' if self.o.workers is not None else 'one per core: the plan needs more than one'}")

    async def _environment(self) -> tuple[dict[str, Any], list[str]]:
        from vramlab.experiment.environment import engine_facts, gpu_facts, host_facts

        fixed: dict[str, Any] = {"engine": self.plan.target.kind, "model": self.plan.target.model, **host_facts()}
        notes: list[str] = []
        if self.o.capture_environment:
            fixed.update(await asyncio.to_thread(gpu_facts))
            headers = {"Authorization": f"Bearer {self.o.api_key}"} if self.o.api_key else {}
            facts, notes = await engine_facts(self.plan.target.url, headers, self.plan.target.model)
            fixed.update(facts)
        fixed.update(self.o.extra_fixed)
        return fixed, notes

    async def _rounds(self) -> None:
        base = self.plan.baseline_value()
        for r in range(1, self.rounds + 1):
            await self._phase(r, "baseline", 0, base)
            value, idx = self.strategy.first(), 1
            while value is not None:
                out = await self._phase(r, "treatment", idx, value)
                if out.stopped is not None:
                    raise _Stopped
                value, idx = self.strategy.next(out), idx + 1
            await self._phase(r, "recovery", 0, base)

    async def _phase(self, rnd: int, phase: str, step: int, value: float) -> StepOutcome:
        if self.stop is not None or self._abort is not None:
            raise _Stopped
        plan, var = self.plan, self.plan.change.variable
        self._where = (rnd, phase, step)
        if value not in self._prompts:
            self._prompts[value] = prompts_for(plan, value, self.o.base_dir)
        seed = (plan.fixed.input.synthetic.seed if plan.fixed.input.synthetic else 0) * 1000 + step
        shape = shape_for(plan, value, seed)
        stats = _WindowStats(where=(rnd, phase, step, value))
        self.emit("phase_start", f"round {rnd}/{self.rounds} {phase}" + (f" step {step}" if step else "")
                  + f": {var} = {value:g}", {"variable": var, "value": value})

        def on_result(res: RequestResult) -> None:
            self._on_request(res, stats)

        lane = Lane(self._prompts[value], shape, window_for(plan, self.monitor.wall_clock_s - self.now()), on_result,
                    f"{rnd}{phase[0]}{step}-")
        self._baseline = BaselineTally(plan.stop_conditions.error_rate) if phase == "baseline" else None
        try:
            outcome = await self.windows.run([lane], retry_for(plan), prompts_key=value)
        finally:
            self._flush_records(stats)
        if self._abort is not None:
            raise _Stopped  # not even a ramp goes on once the run cannot be stored
        broken = self._baseline.broken() if self._baseline is not None else None
        if broken is not None and self.stop is None:  # a change measured against this would measure nothing
            self.fire_stop(StopReason("baseline", 1.0, plan.stop_conditions.error_rate or 1.0,
                                      f"baseline broken, nothing changed: {broken}"))
        lag_p99, lag = None, []
        if outcome is not None:
            lag_p99 = outcome.lag_p99_ms
            lag = self.windows.client_lag(outcome, plan.load.lag_warn_ms)
        saturated = [w for w in lag if w["saturated"]]
        p50, p95 = stats.p(0.5), stats.p(0.95)
        self.emit("phase_end", f"round {rnd}/{self.rounds} {phase}" + (f" step {step}" if step else "")
                  + f": {stats.requests} requests, {stats.errors} errors"
                  + (f", P95 {p95:.0f} ms" if p95 is not None else ""),
                  {"variable": var, "value": value, "requests": stats.requests, "errors": stats.errors,
                   "p50_e2e_ms": p50, "p95_e2e_ms": p95, "dispatch_lag_p99_ms": lag_p99,
                   "client_saturated": bool(saturated), "client_lag": lag})
        for w in saturated:
            self.emit("warning", f"the load generator fell behind in round {rnd} {phase}"
                      + (f" step {step}" if step else "") + f": {w['name']} saturated (dispatch lag P99 "
                      f"{w['dispatch_lag_p99_ms']:.1f} ms, event-loop lag P99 {w['loop_lag_p99_ms']:.1f} ms > "
                      f"{plan.load.lag_warn_ms:g} ms); this window's latencies include the client's own lag "
                      "(latencies from the scheduled time still count it; the offered load was lower than planned"
                      + ("" if self.workers > 1 else "; more load workers: --workers") + ")",
                      {"dispatch_lag_p99_ms": w["dispatch_lag_p99_ms"], "loop_lag_p99_ms": w["loop_lag_p99_ms"],
                       "worker": w["worker"], "pid": w["pid"], "client_saturated": True})
        return StepOutcome(step, value, stats.requests, stats.errors, p95, self.stop)

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
        t0, ok = self.t0, res.ok
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
            self._check()

    def _flush_records(self, stats: _WindowStats) -> None:
        """Turn the window's results into records and hand them to the store writer, in one go."""
        results, stats.results = stats.results, []
        stats.flushed_at = time.perf_counter()
        rnd, phase, step, value = stats.where
        t0, run_id, fire = self.t0, self.run_id, self.hook.fire
        for res in results:
            rec = request_record(res, run_id, t0, rnd, phase, step, value)
            fire(Event("request", rec.end_s or 0.0, rnd, phase, step, payload=rec))

    def _on_samples(self, samples: list[Sample]) -> None:
        recs = []
        for s in samples:
            self.monitor.on_sample(s.name, s.value, s.source + ":" + s.labels.get("gpu", ""))
            if s.source in _SOURCES:
                recs.append(SampleRecord(run_id=self.run_id, t_s=s.t - self.t0, source=s.source,
                                         name=s.name, value=s.value, labels=dict(s.labels)))
        if recs:
            self.hook.fire(Event("samples", recs[0].t_s, *self._where, payload=recs))
        self._check()

    def _check(self) -> None:
        if self.stop is None:
            reason = self.monitor.check(self.now())
            if reason is not None:
                self.fire_stop(reason)

    def fire_stop(self, reason: StopReason) -> None:
        """Stop now: record why and cancel the running window (drills call this for OOM too)."""
        if self.stop is not None:
            return
        if reason.condition == "error_rate" and self._last_4xx:
            # The server's own words for the 4xx behind the error rate: console, run row, every report.
            reason = dataclasses.replace(reason, message=f"{reason.message}; the server said: {self._last_4xx}")
        self.stop = reason
        self.windows.stop()  # every loop, in every worker, sends nothing more from here on
        self.emit("stop_condition", reason.message,
                  {"condition": reason.condition, "value": reason.value, "threshold": reason.threshold})

    def abort(self, reason: str) -> None:
        """Fail the run now (the store writer calls this when the store refuses its rows): the load
        stops, the samplers stop, the target is restored and the rollbacks run, as for a stop."""
        if self._abort is not None:
            return
        self._abort = reason
        self.emit("error", reason)
        self.windows.cancel()

    async def _tick(self) -> None:
        # Sample-based and wall-clock conditions between requests: a hung target sends no results.
        while True:
            await asyncio.sleep(0.1)
            self._check()

    async def _rollback(self, status: str, reason: str | None) -> list[RollbackResult]:
        if not self.plan.rollback:
            return []
        env = {"VRAMLAB_RUN_ID": self.run_id, "VRAMLAB_RUN_STATUS": status, "VRAMLAB_STOP_REASON": reason or ""}

        def on_result(r: RollbackResult) -> None:
            state = "ok" if r.ok else ("timed out" if r.exit_code is None else f"exit {r.exit_code}")
            self.emit("rollback", f"rollback {r.command!r}: {state} in {r.duration_s:.1f} s",
                      {"command": r.command, "exit_code": r.exit_code, "duration_s": r.duration_s,
                       "output_tail": r.output_tail})

        return await run_rollbacks(self.plan.rollback, env, on_result)
