"""One stored run -> everything a report shows. Pure: records in, frozen dataclasses out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vramlab.analysis.rounds import (
    Recovery,
    RoundComparison,
    Stability,
    compare_phases,
    returned_to_baseline,
    stability,
)
from vramlab.analysis.slo_search import searches
from vramlab.analysis.soak import SoakResult, soak_result
from vramlab.analysis.stats import RequestSummary, Slo, request_span, summarize_requests
from vramlab.analysis.tenants import TenantWindow, tenant_slos, tenant_windows
from vramlab.analysis.thresholds import (
    ThresholdCheck,
    check_thresholds,
    highest_passing_value,
    slo_from_metrics,
)
from vramlab.analysis.windows import WindowResult, find_windows, summarize_window
from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
from vramlab.records.events import EventKind, warning_data

# The client fell behind its schedule when dispatch lag P99 passes this: latencies from the
# actual send then understate what users would see (coordinated omission).
DISPATCH_LAG_WARN_MS = 10.0
MIN_ROUNDS = 3
# Series drawn over time in reports, when present.
TIMELINE_SERIES = (
    "gpu.memory_used_bytes",
    "engine.kv_cache_usage_perc",
    "engine.num_requests_waiting",
    "ollama.vram_bytes",
)


@dataclass(frozen=True)
class StepPoint:
    """One step of the changed variable in one round, for the latency/error-rate chart."""

    round: int
    phase: str
    step: int
    step_value: float | None
    e2e_p95_ms: float | None
    ttft_p95_ms: float | None
    error_rate: float


@dataclass(frozen=True)
class Band:
    """Range over rounds of a reference phase's P95 and error rate (drawn as a band)."""

    phase: str
    e2e_p95_ms: tuple[float, float] | None
    error_rate: tuple[float, float]


@dataclass(frozen=True)
class RunAnalysis:
    run: RunRecord
    complete: bool
    duration_s: float
    totals: RequestSummary
    steps: list[WindowResult]
    phases: list[WindowResult]
    comparisons: list[RoundComparison]
    stability: list[Stability]
    recovery: list[Recovery]
    step_points: list[StepPoint]
    bands: list[Band]
    timeline: dict[str, list[tuple[float, float]]]  # sample name -> (t_s, value), max over labels
    events: list[EventRecord]
    warnings: list[str] = field(default_factory=list)
    thresholds: list[ThresholdCheck] = field(default_factory=list)  # per step window, from plan.metrics
    highest_passing_value: float | None = None  # the changed variable's observed limit
    queueing_from_value: float | None = None  # lowest step value where the engine queued requests
    searches: list[dict[str, Any]] = field(default_factory=list)  # change.search: each round's answer
    tenants: list[TenantWindow] = field(default_factory=list)  # conversations: each tenant's SLO, per step
    soak: list[SoakResult] = field(default_factory=list)  # change.soak: each round's verdict
    few_rounds: bool = False  # a complete run of fewer than MIN_ROUNDS rounds (its warning says so)

    @property
    def rounds(self) -> list[int]:
        return sorted({w.window.round for w in self.phases})


def _timeline(samples: Sequence[SampleRecord]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, dict[float, float]] = {}
    for s in samples:
        if s.name in TIMELINE_SERIES:
            series = out.setdefault(s.name, {})
            # several GPUs: the fullest one is the one that runs out first
            series[s.t_s] = max(series.get(s.t_s, s.value), s.value)
    return {name: sorted(points.items()) for name, points in sorted(out.items())}


def _bands(phases: Sequence[WindowResult]) -> list[Band]:
    out = []
    for name in ("baseline", "recovery"):
        rs = [p.requests for p in phases if p.window.phase == name]
        if not rs:
            continue
        p95s = [r.e2e.p95 for r in rs if r.e2e is not None]
        errs = [r.error_rate for r in rs]
        out.append(Band(name, (min(p95s), max(p95s)) if p95s else None, (min(errs), max(errs))))
    return out


def _few_rounds(complete: bool, rounds: int) -> bool:
    return complete and 0 < rounds < MIN_ROUNDS


def _warnings(
    run: RunRecord, complete: bool, steps: Sequence[WindowResult], rounds: int, events: Sequence[EventRecord]
) -> list[str]:
    out = []
    if not complete:
        out.append(
            f"incomplete run (status {run.status}): it was interrupted or is still running; "
            "figures cover what was stored"
        )
    if _few_rounds(complete, rounds):  # a cut-off run says so above already
        out.append(f"only {rounds} round(s): at least {MIN_ROUNDS} are needed to tell a trend from a one-off")
    # The runner warns about lag itself (with the plan's threshold); don't say it twice.
    told = {
        (e.round, e.phase, e.step)
        for e in events
        if e.kind == EventKind.WARNING and "dispatch_lag_p99_ms" in warning_data(e)
    }
    for res in steps:
        lag = res.requests.dispatch_lag
        w = res.window
        if lag is not None and lag.p99 > DISPATCH_LAG_WARN_MS and (w.round, w.phase, w.step) not in told:
            out.append(
                f"client fell behind in round {w.round} {w.phase} step {w.step}: dispatch lag P99 "
                f"{lag.p99:.1f} ms (max {lag.max:.1f} ms); trust the from-scheduled latencies"
            )
    return out


def _queueing_values(steps: Sequence[WindowResult]) -> list[float]:
    """Step values at which the engine's queue ran longer than in that round's baseline, in most
    rounds. (An engine shows a request or two waiting for a moment even when idle.)"""
    waiting = "engine.num_requests_waiting"
    base = {
        s.window.round: s.resources.worst.get(waiting, 0.0) for s in steps if s.window.phase == "baseline"
    }
    votes: dict[float, list[bool]] = {}
    for s in steps:
        w = s.window
        if w.phase in ("treatment", "ramp") and w.step_value is not None and waiting in s.resources.worst:
            votes.setdefault(w.step_value, []).append(s.resources.worst[waiting] > base.get(w.round, 0.0))
    return [v for v, vs in votes.items() if sum(vs) * 2 > len(vs)]


def analyze_run(
    run: RunRecord,
    requests: Sequence[RequestRecord],
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
    slo: Slo | None = None,
) -> RunAnalysis:
    limits = {k: float(v) for k, v in (run.plan.get("metrics") or {}).items() if isinstance(v, (int, float))}
    if slo is None:  # the plan's thresholds, else its search's SLO: the per-request SLO of goodput
        search_slo = ((run.plan.get("change") or {}).get("search") or {}).get("slo") or {}
        slo = slo_from_metrics(limits) or slo_from_metrics(search_slo)
    step_windows, phase_windows = find_windows(requests, events)
    by_step: dict[tuple[int, str, int], list[RequestRecord]] = {}
    by_phase: dict[tuple[int, str], list[RequestRecord]] = {}
    for r in requests:
        by_step.setdefault((r.round, r.phase, r.step), []).append(r)
        by_phase.setdefault((r.round, r.phase), []).append(r)
    steps = [
        summarize_window(w, by_step.get((w.round, w.phase, w.step or 0), []), samples, slo)
        for w in step_windows
    ]
    phases = [summarize_window(w, by_phase.get((w.round, w.phase), []), samples, slo) for w in phase_windows]
    by_key = {(p.window.round, p.window.phase): p for p in phases}
    recovery = []
    for (rnd, phase), res in sorted(by_key.items()):
        base = by_key.get((rnd, "baseline"))
        if phase == "recovery" and base is not None:
            recovery.append(returned_to_baseline(base, res, by_phase.get((rnd, "recovery"), [])))
    span = request_span(requests)
    t_ends = [s.t_s for s in samples] + [e.t_s for e in events] + ([span[1]] if span else [])
    if run.ended_at is not None:
        duration = max(run.ended_at - run.started_at, 0.0)
    else:
        duration = max(t_ends, default=0.0)
    complete = run.status != "running" and run.ended_at is not None and run.status != "interrupted"
    rounds = len({p.window.round for p in phases})
    step_points = [
        StepPoint(
            s.window.round,
            s.window.phase,
            s.window.step or 0,
            s.window.step_value,
            s.requests.e2e.p95 if s.requests.e2e else None,
            s.requests.ttft.p95 if s.requests.ttft else None,
            s.requests.error_rate,
        )
        for s in steps
        if s.window.phase in ("treatment", "ramp")
    ]
    checks = check_thresholds(limits, steps)
    queued = _queueing_values(steps)
    return RunAnalysis(
        run=run,
        complete=complete,
        duration_s=duration,
        totals=summarize_requests(requests, (span[1] - span[0]) if span else 0.0, slo),
        steps=steps,
        phases=phases,
        comparisons=compare_phases(phases),
        stability=stability(steps),
        recovery=recovery,
        step_points=step_points,
        bands=_bands(phases),
        timeline=_timeline(samples),
        events=sorted(events, key=lambda e: e.t_s),
        warnings=_warnings(run, complete, steps, rounds, events),
        thresholds=checks,
        highest_passing_value=highest_passing_value(checks),
        queueing_from_value=min(queued) if queued else None,
        searches=searches(events),
        tenants=tenant_windows(steps, requests, tenant_slos(run.plan)),
        soak=_soaks(run, steps, by_step, samples, events),
        few_rounds=_few_rounds(complete, rounds),
    )


def _soaks(
    run: RunRecord,
    steps: Sequence[WindowResult],
    by_step: dict[tuple[int, str, int], list[RequestRecord]],
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
) -> list[SoakResult]:
    limits = (run.plan.get("change") or {}).get("soak")
    if not limits:
        return []
    out = []
    for s in steps:
        w = s.window
        if w.phase == "treatment":
            mine = by_step.get((w.round, w.phase, w.step or 0), [])
            out.append(soak_result(limits, mine, samples, events, (w.start_s, w.end_s)))
    return out
