"""The built-in report sections, in report order. Each turns the context into blocks."""

from __future__ import annotations

import json
from typing import Any

from vramlab.analysis.windows import PHASE_ORDER, WindowResult
from vramlab.report import fmt
from vramlab.report.blocks import Band, Block, Bullets, Chart, Marker, Series, Shade, Table, Text
from vramlab.report.sections import ReportContext, Section, register

# Events that the tables already tell (windows); the rest form the timeline.
QUIET_EVENTS = ("phase_start", "phase_end", "step", "run_start", "run_end")
MARKED_EVENTS = ("stop_condition", "rollback", "oom", "alert", "recovered", "error")
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
        + ("" if a.complete else " — incomplete: interrupted or still running; figures cover what was stored"),
        f"Started {fmt.utc(run.started_at)}, lasted {fmt.seconds(a.duration_s)}",
        f"{t.count} requests, {t.errors} errors ({fmt.pct(t.error_rate)}), "
        f"E2E P95 {fmt.ms(t.e2e.p95 if t.e2e else None)} ms, TTFT P95 {fmt.ms(t.ttft.p95 if t.ttft else None)} ms",
    ]
    if run.stop_reason:
        items.append(f"Stopped: {run.stop_reason}")
    hyp = run.plan.get("hypothesis")
    if hyp:
        items.append(f"Hypothesis: {hyp}")
    for rec in a.recovery:
        when = "" if rec.after_s is None else (" at once" if rec.after_s == 0 else f" after {rec.after_s:.1f} s")
        items.append(f"Round {rec.round} returned to baseline: {'yes' + when if rec.returned else 'no'}")
    if a.thresholds:
        var = run.change.get("variable", "the changed variable")
        first = next((c for c in a.thresholds if c.passed is False), None)
        limit = ("no step" if a.highest_passing_value is None else f"{var} {fmt.num(a.highest_passing_value)}")
        line = f"Thresholds held in every round up to: {limit}"
        if first is not None:
            line += (f"; first breach: round {first.round} {first.phase}"
                     + ("" if first.step_value is None else f" at {var} {fmt.num(first.step_value)}")
                     + f", {first.metric} {_threshold_value(first.metric, first.value)} vs limit "
                     f"{_threshold_value(first.metric, first.limit)}")
        items.append(line)
    items += _capacity_lines(ctx)
    headline = [s for s in a.stability if s.metric in HEADLINE_METRICS]
    for s in headline:
        if s.spikes:
            items.append(f"One-off in round {s.spikes[0]}: {s.metric} of {s.phase}"
                         + ("" if s.step is None else f" step {s.step}"))
    unstable = [f"{s.metric} of {s.phase}" + ("" if s.step is None else f" step {s.step}")
                for s in headline if s.unstable]
    if unstable:
        items.append("Rounds disagree (spread over 30% of the median, no single outlier): " + ", ".join(unstable))
    return [Bullets(items)]


def _capacity_lines(ctx: ReportContext) -> list[str]:
    """The capacity model's prediction (if the runner stored one in fixed.predicted) beside what
    the run saw: where the engine started queueing and where thresholds last held."""
    a, var = ctx.analysis, ctx.run.change.get("variable", "")
    predicted = ctx.run.fixed.get("predicted") or {}
    out = []
    if a.queueing_from_value is not None:
        waits = [(s.resources.worst.get("engine.num_requests_waiting", 0.0), s.window.step_value) for s in a.steps
                 if s.window.phase in ("treatment", "ramp") and s.window.step_value is not None]
        first = max(w for w, v in waits if v == a.queueing_from_value)
        top, at = max(waits, key=lambda wv: (wv[0], -(wv[1] or 0)))
        out.append(f"Engine queue longer than in baseline from {var} {fmt.num(a.queueing_from_value)} "
                   f"(waiting max {fmt.num(first)}); longest: {fmt.num(top)} at {var} {fmt.num(at)}")
    guess = predicted.get(f"max_{var}") if var else None
    if isinstance(guess, (int, float)):
        seen = [f"thresholds held up to {fmt.num(a.highest_passing_value)}" if a.highest_passing_value is not None
                else "no step met the thresholds"]
        if a.queueing_from_value is not None:
            seen.append(f"queueing from {fmt.num(a.queueing_from_value)}")
        out.append(f"Capacity model predicted max {var} {fmt.num(guess)}; observed: {', '.join(seen)}")
    return out


def plan(ctx: ReportContext) -> list[Block]:
    run, p = ctx.run, ctx.run.plan
    rows = []
    change = run.change or p.get("change")
    if change:
        rows.append(["change", _compact(change)])
    for key in ("hypothesis", "rounds", "phases", "metrics", "stop_conditions", "rollback"):
        if key in p:
            rows.append([key, _compact(p[key])])
    rows.append(["plan hash", run.plan_hash or "–"])
    return [Table(["item", "value"], rows)]


def _compact(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def environment(ctx: ReportContext) -> list[Block]:
    rows = [[k, f"{fmt.gib(v)} GiB" if k.endswith("_bytes") and isinstance(v, (int, float)) else _compact(v)]
            for k, v in ctx.run.fixed.items()]
    rows += [[f"target.{k}", _compact(v)] for k, v in ctx.run.target.items()]
    return [Table(["item", "value"], rows)] if rows else []


def warnings(ctx: ReportContext) -> list[Block]:
    items = list(ctx.analysis.warnings)
    items += [f"{e.t_s:.1f} s: {e.message}" for e in ctx.analysis.events if e.kind == "warning"]
    return [Bullets(items)] if items else []


_LAYERS = ["requests", "err %", "req/s", "out tok/s", "TTFT P95 ms", "E2E P50 ms", "E2E P95 ms",
           "E2E P99 ms", "E2E max ms", "E2E P95 from sched. ms", "waiting max", "KV max", "GPU mem max GiB"]


def _lag_mark(res: WindowResult) -> str:
    """A window whose latencies include the load generator's own lag (the runner's self-check)."""
    return " (client lag)" if res.window.client_lag else ""


def _layer_row(res: WindowResult) -> list[str]:
    r, worst = res.requests, res.resources.worst
    e2e = r.e2e
    return [
        str(r.count), fmt.pct(r.error_rate), fmt.rate(r.throughput_rps), fmt.rate(r.output_tok_s),
        fmt.ms(r.ttft.p95 if r.ttft else None), fmt.ms(e2e.p50 if e2e else None), fmt.ms(e2e.p95 if e2e else None),
        fmt.ms(e2e.p99 if e2e else None), fmt.ms(e2e.max if e2e else None),
        fmt.ms(r.e2e_sched.p95 if r.e2e_sched else None),
        fmt.num(worst.get("engine.num_requests_waiting")), fmt.pct(worst.get("engine.kv_cache_usage_perc")),
        fmt.gib(worst.get("gpu.memory_used_bytes")),
    ]


def phases(ctx: ReportContext) -> list[Block]:
    a = ctx.analysis
    if not a.phases:
        return [Text("No requests were stored for this run.")]
    rows = []
    for comp in a.comparisons:
        for name, res in sorted(comp.phases.items(), key=lambda kv: (PHASE_ORDER.get(kv[0], 9), kv[0])):
            d = comp.deltas.get(name, {}).get("e2e_p95_ms")
            rows.append([str(comp.round), name + _lag_mark(res), *_layer_row(res),
                         fmt.delta_ms(d.delta if d else None)])
    return [
        Text("User layer (requests, errors, latency), service layer (queue, KV cache) and resource layer "
             "(GPU memory) side by side, one row per round and phase. Latencies are of successful requests."),
        Table(["round", "phase", *_LAYERS, "Δ E2E P95 vs baseline ms"], rows),
    ]


def steps(ctx: ReportContext) -> list[Block]:
    a = ctx.analysis
    var = ctx.run.change.get("variable", "value")
    rows = [[str(s.window.round), s.window.phase + _lag_mark(s), str(s.window.step), fmt.num(s.window.step_value),
             *_layer_row(s)] for s in a.steps]
    return [Table(["round", "phase", "step", var, *_LAYERS], rows)] if rows else []


def charts(ctx: ReportContext) -> list[Block]:
    a = ctx.analysis
    var = ctx.run.change.get("variable", "step")
    out: list[Block] = []
    if a.step_points:
        def x(p: Any) -> float:
            return p.step_value if p.step_value is not None else float(p.step)

        lat, err = [], []
        for rnd in a.rounds:
            pts = [p for p in a.step_points if p.round == rnd]
            lat.append(Series(f"round {rnd} E2E P95", [(x(p), p.e2e_p95_ms) for p in pts if p.e2e_p95_ms is not None]))
            err.append(Series(f"round {rnd} error %", [(x(p), p.error_rate * 100) for p in pts]))
        lat_bands = [Band(f"{b.phase} P95 range", *b.e2e_p95_ms) for b in a.bands if b.e2e_p95_ms]
        err_bands = [Band(f"{b.phase} error range", b.error_rate[0] * 100, b.error_rate[1] * 100) for b in a.bands]
        out.append(Chart(f"E2E latency P95 per {var}", var, "ms", lat, bands=lat_bands))
        out.append(Chart(f"Error rate per {var}", var, "%", err, bands=err_bands))
    shades = [Shade(f"r{p.window.round} {p.window.phase}", p.window.start_s, p.window.end_s) for p in a.phases]
    markers = [Marker(e.t_s, f"{e.kind}: {e.message}") for e in a.events if e.kind in MARKED_EVENTS]
    gpu = a.timeline.get("gpu.memory_used_bytes")
    if gpu:
        out.append(Chart("GPU memory used over time (fullest GPU)", "seconds from start", "GiB",
                         [Series("GPU memory used", [(t, v / fmt.GIB) for t, v in gpu])],
                         shades=shades, markers=markers, y_min_zero=False))
    kv = a.timeline.get("engine.kv_cache_usage_perc")
    if kv:
        out.append(Chart("KV cache usage over time", "seconds from start", "%",
                         [Series("KV cache usage", [(t, v * 100) for t, v in kv])], shades=shades, markers=markers))
    if out:
        out.insert(0, Text("Shaded: baseline (blue), treatment (red), recovery (green). Dashed lines: "
                           "stop conditions, rollbacks, OOMs, alerts."))
    return out


def _threshold_value(metric: str, v: float | None) -> str:
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
            f"{_threshold_value(c.metric, c.value)} {mark}")
    headers = ["round", "phase", "step", ctx.run.change.get("variable", "value")]
    headers += [f"{m} ({'≥' if m.startswith('min_') else '≤'} {_threshold_value(m, limits[m])})" for m in metrics]
    body = [[str(k[0]), k[1], "–" if k[2] is None else str(k[2]), fmt.num(k[3]), *(v.get(m, "–") for m in metrics)]
            for k, v in rows.items()]
    return [Text("The plan's thresholds, window by window (latency limits are also the per-request SLO for goodput)."),
            Table(headers, body)]


def stability(ctx: ReportContext) -> list[Block]:
    a = ctx.analysis
    rows = []
    for s in a.stability:
        if s.metric not in STABILITY_METRICS and not s.spikes:
            continue
        is_rate = s.metric == "error_rate"
        show = fmt.pct if is_rate else fmt.num
        rows.append([s.phase, "–" if s.step is None else str(s.step), s.metric,
                     ", ".join(f"r{r}: {show(round(v, 3) if not is_rate else v)}" for r, v in s.by_round.items()),
                     show(s.spread if is_rate else round(s.spread, 3)),
                     "–" if s.rel_spread is None else fmt.pct(s.rel_spread),
                     f"round {s.spikes[0]}" if s.spikes else ("unstable" if s.unstable else "no")])
    if not rows:
        return []
    return [Text("Spread across rounds; a one-off spike is a round far (over 30% or a floor) from the others "
                 "while they agree."), Table(["phase", "step", "metric", "by round", "spread", "spread/median",
                                              "one-off spike"], rows)]


def recovery(ctx: ReportContext) -> list[Block]:
    rows = [[str(r.round), "yes" if r.returned else "no", fmt.seconds(r.after_s), fmt.ms(r.baseline_e2e_p95_ms),
             fmt.ms(r.recovery_e2e_p95_ms), fmt.pct(r.baseline_error_rate), fmt.pct(r.recovery_error_rate), r.reason]
            for r in ctx.analysis.recovery]
    if not rows:
        return []
    return [Table(["round", "returned", "when (into recovery)", "baseline E2E P95 ms", "recovery E2E P95 ms",
                   "baseline err", "recovery err", "why"], rows)]


def events(ctx: ReportContext) -> list[Block]:
    rows = []
    for e in ctx.analysis.events:
        if e.kind in QUIET_EVENTS or e.kind in ("note", "warning"):
            continue
        where = "" if e.round is None else _where(e)
        rows.append([f"{e.t_s:.1f}", e.kind, where, e.message])
    return [Table(["t (s)", "event", "where", "message"], rows)] if rows else []


def notes(ctx: ReportContext) -> list[Block]:
    # The runner keeps notes (and warnings) both on the run row and as timeline events: say each once,
    # with its time when the timeline has it, and leave warnings to their own section.
    warned = {e.message for e in ctx.analysis.events if e.kind == "warning"}
    timed = {e.message: e.t_s for e in ctx.analysis.events if e.kind == "note"}
    items, seen = [], set()
    for msg in [*ctx.run.notes, *timed]:
        if msg in seen or msg in warned:
            continue
        seen.add(msg)
        items.append(f"{timed[msg]:.1f} s: {msg}" if msg in timed else msg)
    return [Bullets(items)] if items else []


for _section in (
    Section("summary", "Summary", summary, order=10),
    Section("plan", "Plan", plan, order=20),
    Section("environment", "Environment", environment, order=30),
    Section("warnings", "Warnings", warnings, order=40),
    Section("phases", "Baseline, treatment and recovery by round", phases, order=50),
    Section("thresholds", "Thresholds", thresholds, order=52),
    Section("steps", "Per step", steps, order=55),
    Section("charts", "Charts", charts, order=60),
    Section("stability", "Stability across rounds", stability, order=70),
    Section("recovery", "Return to baseline", recovery, order=80),
    Section("events", "Stops, rollbacks and other events", events, order=90),
    Section("notes", "Notes", notes, order=95),
):
    register(_section)

