"""The report's first screen: the answer, before any detail.

- The verdict. An experiment's hypothesis is judged by the plan's thresholds (`metrics:`) window by
  window, the Thresholds table: held (with the figure closest to its limit), not held (with the
  first breach) or not judged (no thresholds, a run stopped or cut short). A drill's verdict is its
  incident: the failure mode and where it began, the first abnormal signal, time to detect and to
  recover, the impact. Every figure is the one a table below prints, from the same function.
- Plan against measured in a few lines: the memory composition table's figures folded over its
  windows (a drill's: at the failure), and the capacity model's prediction beside what was seen.
- The key chart (report/charts.py).

The full plan and the environment are the report's appendix (core_sections.py).
"""

from __future__ import annotations

from typing import Any

from vramlab.analysis.composition import FIGURES, LABELS, Figure, Row
from vramlab.records.events import EventKind
from vramlab.report import fmt
from vramlab.report.blocks import Block, Bullets, Table, Text, Verdict
from vramlab.report.charts import colour_key, key_chart
from vramlab.report.composition import band_text, composition_of, sized
from vramlab.report.core_sections import (
    capacity_lines,
    first_breach,
    returned_line,
    threshold_value,
    thresholds_line,
)
from vramlab.report.sections import ReportContext, Section

SCHEMA = "vramlab.answer/1"


# -- an experiment's verdict -------------------------------------------------------------------------


def _closest_to_limit(ctx: ReportContext) -> Any:
    """The passing check nearest its limit (value / limit for an upper limit, limit / value for a
    lower one): the margin the verdict quotes."""

    def used(c: Any) -> float:
        if c.metric.startswith("min_"):
            return c.limit / c.value if c.value else 1.0
        return c.value / c.limit if c.limit else 0.0

    passed = [c for c in ctx.analysis.thresholds if c.passed is True and c.value is not None]
    return max(passed, key=used, default=None)


def _at(ctx: ReportContext, c: Any) -> str:
    var = ctx.run.change.get("variable", "value")
    where = f"round {c.round} {c.phase}"
    return where + ("" if c.step_value is None else f" at {var} {fmt.num(c.step_value)}")


def effect_line(ctx: ReportContext) -> str | None:
    """What the change did at its highest step, round by round: E2E P95 against the round's own
    baseline (the Per step table's delta) and the error rate."""
    a, var = ctx.analysis, ctx.run.change.get("variable", "value")
    treated = [
        s for s in a.steps if s.window.phase in ("treatment", "ramp") and s.window.step_value is not None
    ]
    if not treated:
        return None
    top = max(s.window.step_value or 0.0 for s in treated)
    base = {c.round: c.phases.get("baseline") for c in a.comparisons}
    deltas, errors, rounds = [], [], []
    for s in sorted((s for s in treated if s.window.step_value == top), key=lambda s: s.window.round):
        b = base.get(s.window.round)
        mine = s.requests.e2e.p95 if s.requests.e2e else None
        ref = b.requests.e2e.p95 if b is not None and b.requests.e2e else None
        deltas.append(fmt.delta_ms(None if mine is None or ref is None else mine - ref))
        errors.append(fmt.pct(s.requests.error_rate))
        rounds.append(str(s.window.round))
    err = errors[0] if len(set(errors)) == 1 else ", ".join(errors)
    return (
        f"At {var} {fmt.num(top)}: E2E P95 {', '.join(deltas)} ms against each round's baseline "
        f"(round{'s' if len(rounds) > 1 else ''} {', '.join(rounds)}); error rate {err}"
    )


def experiment_verdict(ctx: ReportContext) -> Verdict:
    """Held: every threshold held in every window and every round returned to its baseline (the
    steady state came back, as a chaos experiment's hypothesis asks). Not held: a threshold broke
    (the first breach) or a round did not return. Not judged: no thresholds, or a run that stopped
    or was cut short before it could break one."""
    a, run = ctx.analysis, ctx.run
    var = run.change.get("variable", "the changed variable")
    hyp = ctx.plan.get("hypothesis")
    said = "The hypothesis" if hyp else "The plan's thresholds"
    limits = sorted({(c.metric, c.limit) for c in a.thresholds})
    judged_by = ", ".join(
        f"{m} {'≥' if m.startswith('min_') else '≤'} {threshold_value(m, v)}" for m, v in limits
    )
    details = [f"Hypothesis: {hyp}" if hyp else "The plan states no hypothesis"]
    if judged_by:
        details.append(
            f"Judged by the plan's thresholds ({judged_by}) in every window, and the return to baseline"
        )
    story = [line for line in (thresholds_line(ctx), returned_line(ctx)) if line]
    effect = [line for line in (effect_line(ctx),) if line]
    breach, closest = first_breach(ctx), _closest_to_limit(ctx)
    lost = [r for r in a.recovery if r.judged and not r.returned]
    held_to = "no step" if a.highest_passing_value is None else f"{var} {fmt.num(a.highest_passing_value)}"
    if breach is not None:
        return Verdict(
            "not-held",
            f"{said} did not hold: {breach.metric} {threshold_value(breach.metric, breach.value)} against its "
            f"limit {threshold_value(breach.metric, breach.limit)}, {_at(ctx, breach)} (the first breach); "
            f"the thresholds held up to {held_to}",
            details + story + effect,
        )
    if closest is None:
        why = "the plan sets no thresholds (`metrics:`)" if not a.thresholds else "no window measured them"
        return Verdict("untested", f"Not judged: {why}", details + story + effect)
    figure = (
        f"closest to its limit: {closest.metric} {threshold_value(closest.metric, closest.value)} of "
        f"{threshold_value(closest.metric, closest.limit)}, {_at(ctx, closest)}"
    )
    if lost:
        return Verdict(
            "not-held",
            f"{said} did not hold: round {', '.join(str(r.round) for r in lost)} did not return to baseline "
            f"({lost[0].reason}); the thresholds held in every window ({figure})",
            details + story + effect,
        )
    if run.stop_reason or not a.complete:
        why = f"the run stopped ({run.stop_reason})" if run.stop_reason else f"the run is {run.status}"
        return Verdict(
            "untested",
            f"Not fully tested: {why}; the thresholds held in every window it reached ({figure})",
            details + story + effect,
        )
    rounds = len(a.rounds)
    returned = " and every round returned to baseline" if a.recovery else ""
    return Verdict(
        "held",
        f"{said} held: every threshold held in all {rounds} round{'s' if rounds != 1 else ''} up to {held_to}"
        f"{returned}; {figure}",
        details + effect,
    )


# -- a drill's verdict ---------------------------------------------------------------------------------


def _clip(text: str, n: int = 160) -> str:
    """A quoted log line cut for the answer box (the root cause section quotes it whole)."""
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def drill_verdict(ctx: ReportContext) -> Verdict:
    from vramlab.report.incident import summary_line, unrecovered
    from vramlab.report.incident_base import incident_of
    from vramlab.report.incident_text import (
        _s,
        _unit,
        alert_clock,
        failure_where,
        from_t0,
        not_recovered_reason,
        recovery_text,
        refused_on_ramp,
        since_t0,
    )

    inc, rounds = incident_of(ctx)
    failed = sum(1 for r in rounds if r.failed)
    lost = unrecovered(ctx)
    details = []
    first = inc.signals.first
    if inc.failed:
        evidence = f" — {_clip(inc.evidence[0])}" if inc.evidence else ""
        details.append(f"Failure mode: `{inc.failure_mode}`{evidence}")
    if first is not None:
        t0 = "" if inc.t0_s is None else f", {since_t0(first.t_s, inc.t0_s)} s from T0"
        details.append(f"First abnormal signal: {first.describe()} ({first.layer} layer{t0})")
    if inc.failed:
        rec = inc.recovery
        details += [
            f"Time to detect: {_s(from_t0(inc.time_to_detect_s, inc.t0_s))} after T0; time to alert: "
            + (alert_clock(inc) if inc.time_to_alert_s is not None else "none fired"),
            f"Recovery: {recovery_text(rec, inc.t0_s)}",
            f"Impact: {inc.impact.failed} failed requests, {inc.impact.failed_logical} never succeeded after "
            f"retries, {inc.impact.affected_clients} clients affected",
        ]
    details.append(
        f"{len(rounds)} round{'s' if len(rounds) != 1 else ''}, {failed} failed"
        + (f"; not recovered in round {', '.join(str(r.round) for r in lost)}" if lost else "")
    )
    if not inc.failed:
        _, bad, _ = refused_on_ramp(ctx)
        line = summary_line(ctx)
        return Verdict("not-held" if bad else "held", line[:1].upper() + line[1:], details)
    where = f"{inc.failure_mode} {failure_where(inc, _unit(ctx))}"
    if lost:
        return Verdict(
            "not-held", f"{where}; not recovered: {not_recovered_reason(inc.recovery, inc.t0_s)}", details
        )
    ttr = _s(from_t0(inc.recovery.time_to_recover_s, inc.t0_s))
    return Verdict("recovered", f"{where}; recovered in {ttr} from T0", details)


# -- plan against measured -----------------------------------------------------------------------------


def _span(values: list[str]) -> str:
    """Several windows' figures as one cell: the value, or lowest to highest."""
    if not values:
        return "–"
    return values[0] if len(set(values)) == 1 else f"{values[0]} to {values[-1]}"


def _measured(figs: list[Figure]) -> str:
    """The measured range in the composition table's units: bytes, or tokens where the engine showed
    only tokens."""
    nbytes = sorted(f.measured_bytes for f in figs if f.measured_bytes is not None)
    if nbytes:
        return _span([sized(b) for b in nbytes])
    tokens = sorted(f.measured_tokens for f in figs if f.measured_tokens is not None)
    return _span([f"{t:,} tokens" for t in tokens])


def folded_rows(rows: list[Row]) -> list[list[str]]:
    """The composition table's figures over its windows: the prediction (one, or its range), the
    measured range, the error range and in how many windows the measurement was inside the band."""
    out = []
    for name in FIGURES:
        figs = [r.figure(name) for r in rows]
        predicted = sorted({band_text(f) for f in figs if f.predicted_bytes is not None})
        measured = _measured(figs)
        errors = sorted(f.error_pct for f in figs if f.error_pct is not None)
        judged = [f.inside_band for f in figs if f.inside_band is not None]
        if not predicted and measured == "–":
            continue
        out.append(
            [
                LABELS[name],
                predicted[0] if len(predicted) == 1 else ("varies per window" if predicted else "–"),
                measured,
                _span([f"{e:+.1f}%" for e in errors]),
                f"{sum(judged)} of {len(judged)}" if judged else "–",
            ]
        )
    return out


def plan_against_measured(ctx: ReportContext) -> list[Block]:
    """The composition table folded (when the run stored a plan or start-up figures), then the
    capacity model's predicted limit beside what the run saw."""
    if ctx.run.kind == "drill":
        from vramlab.report.incident_base import incident_of
        from vramlab.report.incident_cause import predicted_limit_line

        lines = [line for line in (predicted_limit_line(ctx, incident_of(ctx)[0]),) if line]
    else:
        lines = capacity_lines(ctx)
    out: list[Block] = []
    if any(e.kind in (EventKind.CAPACITY_PLAN, EventKind.STARTUP_MEMORY) for e in ctx.events):
        c = composition_of(ctx)
        at_failure = [r for _, r in c.at_failure]
        rows = at_failure or c.rows
        if c.plan and rows:
            where = (
                "at the failure" if at_failure else f"over {len(rows)} window{'s' if len(rows) != 1 else ''}"
            )
            out.append(
                Table(
                    [
                        "Figure",
                        "Predicted GiB (band)",
                        "Measured GiB",
                        "Error % (pred. − meas.)",
                        "In band (windows)",
                    ],
                    folded_rows(rows),
                    caption=f"Plan against measured {where}: {c.plan.model} on {c.plan.gpu}, "
                    f"{c.plan.engine} {c.plan.engine_version} (GiB = 2^30 bytes)",
                )
            )
        elif not c.plan:
            why = "; ".join(c.notes) or "its facts were not known"
            lines.insert(0, f"No capacity plan was stored with this run: {why}")
    return out + ([Bullets(lines)] if lines else [])


# -- the section ---------------------------------------------------------------------------------------


def verdict_of(ctx: ReportContext) -> Verdict:
    return ctx.memo(
        "verdict", lambda: drill_verdict(ctx) if ctx.run.kind == "drill" else experiment_verdict(ctx)
    )


def answer(ctx: ReportContext) -> list[Block]:
    out: list[Block] = [verdict_of(ctx), *plan_against_measured(ctx)]
    chart = key_chart(ctx)
    if chart is not None:
        out.append(chart)
        key = colour_key([chart])
        if key:
            out.append(Text(key))
    return out


def answer_json(ctx: ReportContext) -> dict[str, Any]:
    v = verdict_of(ctx)
    chart = key_chart(ctx)
    table = next((b for b in plan_against_measured(ctx) if isinstance(b, Table)), None)
    return {
        "schema": SCHEMA,
        "verdict": v.status,
        "headline": v.headline,
        "details": v.details,
        "plan_against_measured": None
        if table is None
        else [dict(zip(table.headers, row, strict=True)) for row in table.rows],
        "key_chart": None if chart is None else chart.title,
    }


SECTIONS = (Section("answer", "Answer", answer, order=1, data=answer_json),)
