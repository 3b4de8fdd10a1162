"""The incident report's words and clocks, apart from its sections: each clock against T0, signal
values in their units, the recovery sentence, and the lessons and action items that follow from the
failure mode. Pure functions of the analysed `Incident` (report/incident.py lays them out)."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal

from vramlab.analysis.aftermath import Recovery, RetryStorm
from vramlab.analysis.incident import Incident
from vramlab.records import RequestRecord
from vramlab.report import fmt
from vramlab.report.sections import ReportContext


def _s(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f} s"


def _unit(ctx: ReportContext) -> str:
    return str((ctx.run.change or {}).get("unit", ""))


def _cs(t_s: float) -> Decimal:
    """A moment as the report prints it: to the hundredth, rounded exactly as `f"{t:.2f}"` rounds."""
    return Decimal(t_s).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)


def since_t0(t_s: float, t0: float | None) -> str:
    """The one relative clock of the incident report (timeline, detection, alerts): signed seconds
    from T0 (the failure's first evidence), as the difference of the two printed moments, so two
    rows that print the same `t (s)` never print different `T0 +` values."""
    return "–" if t0 is None else f"{_cs(t_s) - _cs(t0):+.2f}"


def from_t0(d: float | None, t0: float | None) -> float | None:
    """A duration measured from T0 (time to detect, alert, recover...) on the same printed clock as
    `since_t0`: the moment T0 + d, printed, less T0 printed. Without T0 the duration is as measured."""
    if d is None or t0 is None:
        return d
    return float(_cs(t0 + d) - _cs(t0))


def failure_where(inc: Incident, unit: str) -> str:
    """Where on the ramp the failure began, as the headline says it: the step that carried load,
    with the last safe one (or that no step had sent a request, or that the trigger is uncertain)."""
    step, trig = inc.failure_step or {}, inc.trigger
    if trig is not None and trig.step is None:
        return "before any ramp step had sent a request"
    if trig is not None and trig.confidence == "low":
        return f"while {fmt.num(step.get('value'))} {unit} carried load (trigger confidence low)"
    return f"at {fmt.num(step.get('value'))} {unit} (last safe {fmt.num(inc.last_safe_value)})"


def alert_clock(inc: Incident) -> str:
    """Time to alert on the alert table's clock, as the incident's JSON carries it: an alert already
    firing at T0 reads negative, not 0.00 s."""
    t = from_t0(inc.time_to_alert_s, inc.t0_s)
    if t is not None and t < 0:
        return f"{t:+.2f} s (already firing before T0)"
    return _s(t)


def signal_value(name: str, v: float | None) -> str:
    """A signal's value in its own unit: shares and rates in %, latencies in ms, counts as counts."""
    if v is None:
        return "–"
    if name.endswith(("_share", "_rate", "_perc")):
        return fmt.pct(v)
    if name.endswith("_ms"):
        return f"{fmt.ms(v)} ms"
    return fmt.num(round(v, 3))


def recovery_text(rec: Recovery, t0: float | None = None) -> str:
    """Recovery with every clock it is made of, so 'serving again' and 'recovered' never read as two
    answers: time to recover is the latest of serving again, health 200 and P95 back."""
    if not rec.recovered:
        return _not_recovered(rec, t0)
    first, health, p95 = (from_t0(v, t0) for v in (rec.first_success_s, rec.health_ok_s, rec.p95_ok_s))
    parts = [
        f"serving again +{first:.2f} s" if first is not None else None,
        f"health 200 +{health:.2f} s" if rec.health_failed and health is not None else None,
        f"P95 back +{p95:.2f} s" if p95 is not None else None,
    ]
    clocks = ", ".join(p for p in parts if p)
    return f"recovered in {_s(from_t0(rec.time_to_recover_s, t0))} from T0" + (
        f" (the latest of: {clocks})" if clocks else ""
    )


T0_WORDS = "the failure's first evidence: the first failed request's end, the process exit or the OOM line"


def storm_figures(st: RetryStorm) -> str:
    """The retry storm's figures as the storm table prints them (the one computation)."""
    peak = (
        "" if st.peak_amplification is None else f" (peak {st.peak_amplification:.2f}× in its busiest second)"
    )
    return (
        f"attempts {st.amplification or 0:.2f}× the baseline's offered rate over the recovery window{peak}, "
        f"{st.retries_in_window} retries"
    )


def peak_text(st: RetryStorm, t0: float | None) -> str:
    """The busiest second of the retry wave: its amplification and when, from T0."""
    if st.peak_amplification is None:
        return "–"
    when = "" if st.peak_at_s is None else f" (the second from T0 {since_t0(st.peak_at_s, t0)} s)"
    return f"{st.peak_amplification:.2f}×{when}"


def storm_text(st: RetryStorm) -> str:
    """The retry storm in one sentence, from the one computation every section quotes."""
    if st.amplification is None:
        return "retry storm: not measured (no baseline rate or no recovery window)"
    return f"retry storm: {'yes' if st.storm else 'no'} — {storm_figures(st)}"


OOM_MODES = ("crash_after_oom", "oom_no_exit", "oom_killed")


def _base_mode(mode: str) -> str:
    return mode.split("+")[0]


def not_recovered_reason(rec: Recovery, t0: float | None = None) -> str:
    """Which of recovery's clocks never came back: serving, health, or latency back to baseline."""
    if rec.first_success_s is None:
        return "no successful request after the failure within the recovery limit"
    if rec.health_failed and rec.health_ok_s is None:
        return f"serving again after {_s(from_t0(rec.first_success_s, t0))} but health still failing"
    return (
        f"serving again after {_s(from_t0(rec.first_success_s, t0))}, but P95 latency not back to the "
        "baseline's within the observation window"
    )


def _not_recovered(rec: Recovery, t0: float | None = None) -> str:
    if rec.first_success_s is None:
        return "NOT recovered within the limit: no successful request after the failure"
    return f"{not_recovered_reason(rec, t0)}: NOT recovered"


def lessons(inc: Incident) -> tuple[list[str], list[str], list[str]]:
    well, wrong, lucky = [], [], []
    if inc.failed:
        if inc.time_to_detect_s is not None and inc.time_to_detect_s <= 5:
            well.append(
                f"The failure was detected {_s(from_t0(inc.time_to_detect_s, inc.t0_s))} after T0 "
                "(its first evidence)"
            )
        if inc.signature:
            well.append("The engine log carried a recognisable failure signature (the cause is observable)")
        if inc.recovery.recovered:
            well.append(f"Service {recovery_text(inc.recovery, inc.t0_s)}")
        else:
            # the same clock as the headline: never "did not serve again" when it served again but P95 stayed high
            wrong.append(f"Not recovered: {not_recovered_reason(inc.recovery, inc.t0_s)}")
        if inc.time_to_alert_s is None:
            wrong.append("No alert fired during the incident: users saw errors before any page")
        if inc.impact.in_flight_lost:
            wrong.append(f"{inc.impact.in_flight_lost} in-flight requests were lost at the failure")
    for n in inc.neighbours:
        (wrong if n.affected else well).append(
            f"Neighbour {n.name} {'was' if n.affected else 'was not'} affected (blast radius)"
        )
    st = inc.retry_storm
    if st.second_oom:
        wrong.append("Recovery set off a second OOM")
    if st.storm:
        wrong.append(
            f"Recovery drew a retry storm: {storm_figures(st)}, {st.attempts_per_request or 0:.2f} attempts "
            "per request"
        )
    elif st.amplification is not None and inc.failed:
        well.append(f"No retry storm: {storm_figures(st)}")
    if inc.failed and not inc.neighbours:
        lucky.append("No neighbour shared the card in this drill; the blast radius is untested")
    if inc.failed and inc.recovery.recovered and not st.second_oom and st.retries:
        lucky.append("The retry wave did not push the restarted target over again this time")
    return well, wrong, lucky


def _owner(ctx: ReportContext, prefer: tuple[str, ...] = ("page", "critical")) -> str:
    rules = ctx.plan.get("alerts") or []
    for sev in (*prefer, "warning", "info"):
        for r in rules:
            if r.get("severity") == sev and r.get("owner"):
                return str(r["owner"])
    return "unassigned"


def action_items(ctx: ReportContext, inc: Incident) -> list[list[str]]:
    """Action items follow from the failure mode: a load cap only where memory or load caused it."""
    unit, owner = _unit(ctx), _owner(ctx)
    rows: list[list[str]] = []
    mode = _base_mode(inc.failure_mode)
    knob = (inc.failure_step or {}).get("knob")
    if inc.failed and mode in (*OOM_MODES, "overload_429") and inc.last_safe_value is not None:
        rows.append(
            [
                f"cap {knob} at {fmt.num(inc.last_safe_value)} {unit} (failed at "
                f"{fmt.num((inc.failure_step or {}).get('value'))}); keep a margin below it",
                "prevent",
                owner,
            ]
        )
    sig = next((m.group(0) for e in inc.evidence if (m := re.search(r"killed by signal \d+ \(\w+", e))), None)
    if inc.failed and mode == "killed_by_signal":
        rows.append(
            [
                f"find what sent the signal ({(sig + ')') if sig else 'see the evidence'}): a supervisor's stop "
                "timeout, an operator, the kernel OOM killer (its log says 'Killed process'); no load cap "
                "follows, nothing tied the kill to load or memory",
                "investigate",
                owner,
            ]
        )
    if inc.failed and mode in ("crash", "crash_xid"):
        rows.append(
            [
                "read the engine's log around the exit and fix or report the crash; no load cap follows, "
                "nothing said out of memory",
                "investigate",
                owner,
            ]
        )
    if inc.failed and mode in ("killed_by_signal", "crash", "crash_xid") and inc.mitigated_s is None:
        rows.append(
            [
                "restart the target on exit (systemd Restart=on-failure, a k8s liveness probe)",
                "mitigate",
                owner,
            ]
        )
    if inc.failed and mode == "hang":
        rows.append(
            [
                "probe liveness with a one-token generation that counts timeouts as failures, and restart on "
                "it: /health stayed up while requests hung",
                "mitigate",
                owner,
            ]
        )
    if inc.failed and mode == "overload_429":
        rows.append(
            [
                "clients: back off on 429/503 with jitter; size the engine's queue or admission limit",
                "mitigate",
                owner,
            ]
        )
    if inc.failed and inc.failure_mode.endswith("startup_refusal_on_restart"):
        rows.append(
            [
                "make the restart configuration start: the restart was refused (see the evidence) — check its "
                "flags, context size and memory against the card",
                "mitigate",
                owner,
            ]
        )
    if inc.failed and inc.time_to_alert_s is None:
        rows.append(
            [
                "add or shorten an alert that fires within the incident (error rate, target down)",
                "process",
                owner,
            ]
        )
    if not inc.recovery.recovered and inc.failed and mode in OOM_MODES:
        rows.append(
            ["make the supervisor restart the target, and check the restart fits the card", "mitigate", owner]
        )
    st = inc.retry_storm
    if st.storm:
        rows.append(["clients: exponential back-off with jitter and a retry cap", "mitigate", owner])
    for n in inc.neighbours:
        if n.affected:
            rows.append(
                [f"isolate neighbour {n.name} (separate card, MIG, or memory limits)", "prevent", owner]
            )
    return rows


def ramp_failed(ctx: ReportContext) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """(the ramp's requests that came back, those of them that failed): refused requests too."""
    back = [r for r in ctx.requests if r.phase == "ramp" and r.error_class != "cancelled"]
    return back, [r for r in back if not r.ok]


def ceiling_line(ctx: ReportContext, top: float | None, unit: str) -> str:
    """The ramp ended without a detected failure: "held at the ceiling" only when no request failed;
    otherwise how many failed, from which step, and the server's words (a refusal for length)."""
    back, failed = ramp_failed(ctx)
    if not failed:
        return f"no OOM up to {fmt.num(top)} {unit}: the target held at the ceiling"
    first = min(failed, key=lambda r: (r.step_value or 0, r.end_s or 0))
    classes: dict[str, int] = {}
    for r in failed:
        key = r.error_class or f"http_{r.status_code}"
        classes[key] = classes.get(key, 0) + 1
    said = " ".join((first.error or "").split())[:200]
    return (
        f"no OOM up to {fmt.num(top)} {unit}, but {len(failed)} of {len(back)} ramp requests failed, from "
        f"{fmt.num(first.step_value)} {unit} ({', '.join(f'{k} {v}' for k, v in sorted(classes.items()))})"
        + (f"; the server said: {said}" if said else "")
    )


def impact_without_failure(ctx: ReportContext) -> list[list[str]]:
    """The impact table of a drill that detected no failure: what the ramp's requests got (there is
    no T0 to count from, and "failed attempts 0" would hide refused requests)."""
    back, failed = ramp_failed(ctx)
    classes: dict[str, int] = {}
    for r in failed:
        key = r.error_class or f"http_{r.status_code}"
        classes[key] = classes.get(key, 0) + 1
    return [
        ["failure detected", "no (no T0: the figures below are the ramp's)"],
        ["ramp requests that came back", str(len(back))],
        ["failed attempts in the ramp", str(len(failed))],
        ["errors by class", ", ".join(f"{k} {v}" for k, v in sorted(classes.items())) or "–"],
    ]


def refused_on_ramp(ctx: ReportContext) -> tuple[int, int, list[str]]:
    """(models the co-location ramp added, how many of them did not start, their outcomes), from the
    same outcomes the co-location table shows."""
    from vramlab.analysis.colocation import analyse_colocation

    c = analyse_colocation(ctx.events, ctx.samples)
    if c is None:
        return 0, 0, []
    added = [c.cell(e, "ramp") for e in c.engines()]
    seen = [o for o in added if o is not None]
    bad = [o for o in seen if o.outcome != "started"]
    return len(seen), len(bad), [f"{o.engine} {o.outcome}" for o in bad]
