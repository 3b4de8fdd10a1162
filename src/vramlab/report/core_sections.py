"""The built-in report sections, in report order. Each turns the context into blocks."""

from __future__ import annotations

from typing import Any

from vramlab.analysis.stats import ITL_UNTIMED_WARN
from vramlab.records.events import EventKind, warning_data
from vramlab.report import fmt
from vramlab.report.blocks import Block, Bullets, Table, Text
from vramlab.report.prompt_tokens import prompt_tokens_line
from vramlab.report.sections import ReportContext, Section
from vramlab.report.window_tables import host_line, itl_sentence, phases, steps

# Events that the tables already tell (windows); the rest form the timeline.
K = EventKind
QUIET_EVENTS = (K.PHASE_START, K.PHASE_END, K.STEP, K.RUN_START, K.RUN_END)
STABILITY_METRICS = ("e2e_p95_ms", "ttft_p95_ms", "error_rate", "throughput_rps")
HEADLINE_METRICS = ("e2e_p95_ms", "error_rate")


def _where(w: Any) -> str:
    step = "" if w.step is None else f" step {w.step}"
    value = "" if getattr(w, "step_value", None) is None else f" ({fmt.num(w.step_value)})"
    return f"round {w.round} {w.phase}{step}{value}"


def summary(ctx: ReportContext) -> list[Block]:
    a, run = ctx.analysis, ctx.run
    t = a.totals
    items = [
        f"Run `{run.run_id}` ({run.kind}) `{run.name}`: status **{run.status}**"
        + (
            "" if a.complete else " — incomplete: interrupted or still running; figures cover what was stored"
        ),
        f"Started {fmt.utc(run.started_at)}, lasted {fmt.seconds(a.duration_s)}",
        f"{t.count} requests, {t.errors} errors ({fmt.pct(t.error_rate)}), "
        f"E2E P95 {fmt.ms(t.e2e.p95 if t.e2e else None)} ms, TTFT P95 {fmt.ms(t.ttft.p95 if t.ttft else None)} ms",
    ]
    if run.stop_reason:
        items.append(f"Stopped: {run.stop_reason}")
    items += [line for line in (host_line(ctx), prompt_tokens_line(ctx)) if line]
    headline = [s for s in a.stability if s.metric in HEADLINE_METRICS]
    for s in headline:
        if s.spikes:
            items.append(
                f"One-off in round {s.spikes[0]}: {s.metric} of {s.phase}"
                + ("" if s.step is None else f" step {s.step}")
            )
    unstable = [
        f"{s.metric} of {s.phase}" + ("" if s.step is None else f" step {s.step}")
        for s in headline
        if s.unstable
    ]
    if unstable:
        items.append(
            "Rounds disagree (spread over 30% of the median, no single outlier): " + ", ".join(unstable)
        )
    # The hypothesis, thresholds, return to baseline and the capacity model's prediction are the
    # answer's (answer.py); the ITL bookkeeping comes last: it qualifies a figure, it is not one.
    return [Bullets(items + itl_lines(ctx))]


def itl_lines(ctx: ReportContext) -> list[str]:
    """How many inter-token gaps the ITL figures rest on, and the windows marked for too few."""
    a = ctx.analysis
    items = [line for line in (itl_sentence(a.totals),) if line]
    # Per step where the run has steps (a phase row would repeat its one step's), else per phase.
    stepped = {(s.window.round, s.window.phase) for s in a.steps}
    few = [
        _where(w.window)
        for w in (*(p for p in a.phases if (p.window.round, p.window.phase) not in stepped), *a.steps)
        if w.requests.itl_few_timed
    ]
    if few:
        items.append(
            f"ITL marked where over {ITL_UNTIMED_WARN:.0%} of the gaps could not be timed "
            "(its tail rests on the gaps left): " + ", ".join(few)
        )
    return items


def returned_line(ctx: ReportContext) -> str | None:
    """Each round's return to baseline, in one line (the Return to baseline table's verdicts)."""
    parts = []
    for rec in ctx.analysis.recovery:
        when = (
            "" if rec.after_s is None else (" at once" if rec.after_s == 0 else f" after {rec.after_s:.1f} s")
        )
        said = ("yes" + when) if rec.returned else ("no" if rec.judged else f"not judged ({rec.reason})")
        parts.append(f"round {rec.round} {said}")
    return "Returned to baseline: " + "; ".join(parts) if parts else None


def thresholds_line(ctx: ReportContext) -> str | None:
    """How far the thresholds held, and the first breach (the Thresholds table's first BREACH)."""
    a, var = ctx.analysis, ctx.run.change.get("variable", "the changed variable")
    if not a.thresholds:
        return None
    first = first_breach(ctx)
    limit = "no step" if a.highest_passing_value is None else f"{var} {fmt.num(a.highest_passing_value)}"
    line = f"Thresholds held in every round up to: {limit}"
    if first is not None:
        line += (
            f"; first breach: round {first.round} {first.phase}"
            + ("" if first.step_value is None else f" at {var} {fmt.num(first.step_value)}")
            + f", {first.metric} {threshold_value(first.metric, first.value)} vs limit "
            f"{threshold_value(first.metric, first.limit)}"
        )
    return line


def first_breach(ctx: ReportContext) -> Any:
    """The first window where a threshold broke (window order, as the Thresholds table lists them)."""
    return next((c for c in ctx.analysis.thresholds if c.passed is False), None)


def capacity_lines(ctx: ReportContext) -> list[str]:
    """The capacity model's prediction (if the runner stored one in fixed.predicted) beside what
    the run saw: where the engine started queueing and where thresholds last held."""
    a, var = ctx.analysis, ctx.run.change.get("variable", "")
    predicted = ctx.run.fixed.get("predicted") or {}
    out = []
    if a.queueing_from_value is not None:
        waits = [
            (s.resources.worst.get("engine.num_requests_waiting", 0.0), s.window.step_value)
            for s in a.steps
            if s.window.phase in ("treatment", "ramp") and s.window.step_value is not None
        ]
        first = max(w for w, v in waits if v == a.queueing_from_value)
        top, at = max(waits, key=lambda wv: (wv[0], -(wv[1] or 0)))
        out.append(
            f"Engine queue longer than in baseline from {var} {fmt.num(a.queueing_from_value)} "
            f"(waiting max {fmt.num(first)}); longest: {fmt.num(top)} at {var} {fmt.num(at)}"
        )
    guess = predicted.get(f"max_{var}") if var else None
    if isinstance(guess, (int, float)):
        seen = [
            f"thresholds held up to {fmt.num(a.highest_passing_value)}"
            if a.highest_passing_value is not None
            else "no step met the thresholds"
        ]
        if a.queueing_from_value is not None:
            seen.append(f"queueing from {fmt.num(a.queueing_from_value)}")
        line = f"Capacity model predicted max {var} {fmt.num(guess)}; observed: {', '.join(seen)}"
        # The first value where a threshold broke (the same breach the thresholds line names).
        broke = next(
            (c.step_value for c in a.thresholds if c.passed is False and c.step_value is not None), None
        )
        if broke is not None and guess >= broke:
            line += f" — the prediction was on the unsafe side (at or above the first breach, {var} {fmt.num(broke)})"
        elif a.highest_passing_value is not None and guess <= a.highest_passing_value:
            line += " — the prediction was on the safe side"
        out.append(line)
    return out


def plan(ctx: ReportContext) -> list[Block]:
    run, p = ctx.run, ctx.plan
    rows: list[list[str]] = []
    change = run.change or p.get("change")
    if change:
        rows += flat_rows("change", change)
    for key in ("hypothesis", "rounds", "phases", "load", "metrics", "stop_conditions", "rollback"):
        if key in p and p[key] not in (None, "", [], {}):
            rows += flat_rows(key, p[key])
    rows.append(["plan hash", f"`{run.plan_hash}`" if run.plan_hash else "–"])
    return [Table(["item", "value"], rows)]


def value_text(v: Any) -> str:
    """One plan or environment value as a reader writes it: no JSON, no null."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return fmt.num(v)
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        if all(not isinstance(x, (dict, list)) for x in v):
            return ", ".join(value_text(x) for x in v) or "–"
        return "; ".join(value_text(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}: {value_text(x)}" for k, x in v.items() if x is not None) or "–"
    return str(v)


def flat_rows(prefix: str, v: Any) -> list[list[str]]:
    """A nested plan value as one row per leaf (`change.ramp.factor | 2`); lists of mappings (rollback
    commands) one row each."""
    if isinstance(v, dict):
        out: list[list[str]] = []
        for k, x in v.items():
            if x is None or x == {} or x == []:
                continue
            out += flat_rows(f"{prefix}.{k}", x)
        return out
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        return [
            [
                f"{prefix} {i + 1}",
                value_text(x.get("run", x)) if set(x) <= {"run", "timeout_s"} else value_text(x),
            ]
            for i, x in enumerate(v)
        ]
    return [[prefix, value_text(v)]]


def environment(ctx: ReportContext) -> list[Block]:
    rows = [
        [k, f"{fmt.gib(v)} GiB" if k.endswith("_bytes") and isinstance(v, (int, float)) else value_text(v)]
        for k, v in ctx.run.fixed.items()
        if v is not None
    ]
    rows += [[f"target.{k}", value_text(v)] for k, v in ctx.run.target.items() if v is not None]
    return [Table(["item", "value"], rows)] if rows else []


def warnings(ctx: ReportContext) -> list[Block]:
    items = list(ctx.analysis.warnings)
    # The drill logs its plan's too-few-rounds warning as an event too; the analysis already says it.
    rounds_said = ctx.analysis.few_rounds
    for e in ctx.analysis.events:
        if e.kind != K.WARNING or (rounds_said and warning_data(e).get("plan_field") == "rounds"):
            continue
        items.append(f"{e.t_s:.1f} s: {e.message}")
    return [Bullets(list(dict.fromkeys(items)))] if items else []


def threshold_value(metric: str, v: float | None) -> str:
    """A threshold's value in its unit: error rates in %, rates in req/s, latencies in ms."""
    if v is None:
        return "–"
    if metric == "error_rate":
        return fmt.pct(v)
    return f"{v:,.2f} req/s" if metric.endswith("_rps") else f"{v:,.1f} ms"


def thresholds(ctx: ReportContext) -> list[Block]:
    checks = ctx.analysis.thresholds
    if not checks:
        return []
    metrics = sorted({c.metric for c in checks})
    limits = {c.metric: c.limit for c in checks}
    rows: dict[tuple[int, str, int | None, float | None], dict[str, str]] = {}
    for c in checks:
        mark = {True: "ok", False: "BREACH", None: "n/a"}[c.passed]
        rows.setdefault((c.round, c.phase, c.step, c.step_value), {})[c.metric] = (
            f"{threshold_value(c.metric, c.value)} {mark}"
        )
    headers = ["round", "phase", "step", ctx.run.change.get("variable", "value")]
    headers += [
        f"{m} ({'≥' if m.startswith('min_') else '≤'} {threshold_value(m, limits[m])})" for m in metrics
    ]
    body = [
        [
            str(k[0]),
            k[1],
            "–" if k[2] is None else str(k[2]),
            fmt.num(k[3]),
            *(v.get(m, "–") for m in metrics),
        ]
        for k, v in rows.items()
    ]
    return [
        Text(
            "The plan's thresholds, window by window (latency limits are also the per-request SLO for goodput)."
        ),
        Table(headers, body),
    ]


def _metric_fmt(metric: str) -> Any:
    """One precision per kind of figure, everywhere: ms to 0.1, rates to 0.01, error rates in %."""
    if metric == "error_rate":
        return fmt.pct
    if metric.endswith("_rps") or metric.endswith("_tok_s"):
        return fmt.rate
    if metric.endswith("_ms"):
        return fmt.ms
    return fmt.num


def stability(ctx: ReportContext) -> list[Block]:
    a = ctx.analysis
    rows = []
    for s in a.stability:
        if s.metric not in STABILITY_METRICS and not s.spikes:
            continue
        show = _metric_fmt(s.metric)
        rows.append(
            [
                s.phase,
                "–" if s.step is None else str(s.step),
                s.metric,
                ", ".join(f"r{r}: {show(v)}" for r, v in s.by_round.items()),
                show(s.spread),
                "–" if s.rel_spread is None else fmt.pct(s.rel_spread),
                f"round {s.spikes[0]}" if s.spikes else ("unstable" if s.unstable else "no"),
            ]
        )
    if not rows:
        return []
    return [
        Text(
            "Spread across rounds; a one-off spike is a round far (over 30% or a floor) from the others "
            "while they agree."
        ),
        Table(["phase", "step", "metric", "by round", "spread", "spread/median", "one-off spike"], rows),
    ]


def _not_drill(ctx: ReportContext) -> bool:
    """Drills have their own recovery clocks and timeline (the incident sections): one source each."""
    return ctx.run.kind != "drill"


def recovery(ctx: ReportContext) -> list[Block]:
    rows = [
        [
            str(r.round),
            "yes" if r.returned else ("no" if r.judged else "not judged"),
            fmt.seconds(r.after_s),
            fmt.ms(r.baseline_e2e_p95_ms),
            fmt.ms(r.recovery_e2e_p95_ms),
            fmt.pct(r.baseline_error_rate),
            fmt.pct(r.recovery_error_rate),
            r.reason,
        ]
        for r in ctx.analysis.recovery
    ]
    if not rows:
        return []
    return [
        Table(
            [
                "round",
                "returned",
                "when (into recovery)",
                "baseline E2E P95 ms",
                "recovery E2E P95 ms",
                "baseline err",
                "recovery err",
                "why",
            ],
            rows,
        )
    ]


def events(ctx: ReportContext) -> list[Block]:
    rows = []
    for e in ctx.analysis.events:
        if e.kind in QUIET_EVENTS or e.kind in (K.NOTE, K.WARNING):
            continue
        where = "" if e.round is None else _where(e)
        rows.append([f"{e.t_s:.1f}", e.kind, where, e.message])
    return [Table(["t (s)", "event", "where", "message"], rows)] if rows else []


def notes(ctx: ReportContext) -> list[Block]:
    # The runner keeps notes (and warnings) both on the run row and as timeline events: say each once,
    # with its time when the timeline has it, and leave warnings to their own section.
    warned = {e.message for e in ctx.analysis.events if e.kind == K.WARNING}
    timed = {e.message: e.t_s for e in ctx.analysis.events if e.kind == K.NOTE}
    items, seen = [], set()
    for msg in [*ctx.run.notes, *timed]:
        if msg in seen or msg in warned:
            continue
        seen.add(msg)
        items.append(f"{timed[msg]:.1f} s: {msg}" if msg in timed else msg)
    return [Bullets(items)] if items else []


SECTIONS = (
    Section("summary", "Summary", summary, order=10),
    Section("plan", "Plan", plan, order=20, appendix=True),
    Section("environment", "Environment", environment, order=30, appendix=True),
    Section("warnings", "Warnings", warnings, order=40),
    Section("phases", "Baseline, treatment and recovery by round", phases, order=50),
    Section("thresholds", "Thresholds", thresholds, order=52),
    Section("steps", "Per step", steps, order=55),
    Section("stability", "Stability across rounds", stability, order=70),
    Section("recovery", "Return to baseline", recovery, order=80, applies=_not_drill),
    Section("events", "Stops, rollbacks and other events", events, order=90, applies=_not_drill),
    Section("notes", "Notes", notes, order=95),
)
