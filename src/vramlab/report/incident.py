"""Incident report sections for drill runs, in the blameless postmortem shape (Google SRE example
postmortem + PagerDuty's exact-number impact table; docs/research/drill-anchors.md §5):

summary · impact · timeline · detection (first abnormal signal, alerts) · root cause and trigger ·
resolution and recovery (with the T-boundaries used) · blast radius · retry storm ·
lessons (went well / went wrong / got lucky) · action items · rounds compared.

Registered with the report's section registry for runs of kind "drill"; pure renderers over the
stored records (via `vramlab.analysis.incident.analyse`).
"""

from __future__ import annotations

from typing import Any

from vramlab.analysis.incident import Incident
from vramlab.plandoc import Retry
from vramlab.records.events import EventKind, alert_data, retry_storm_data
from vramlab.report import fmt
from vramlab.report.blocks import Block, Bullets, Table, Text
from vramlab.report.incident_base import incident_of, plan_section
from vramlab.report.incident_cause import s_cause, s_detection
from vramlab.report.incident_text import (
    T0_WORDS,
    _s,
    _unit,
    action_items,
    alert_clock,
    ceiling_line,
    failure_where,
    from_t0,
    impact_without_failure,
    lessons,
    not_recovered_reason,
    peak_text,
    recovery_text,
    refused_on_ramp,
    since_t0,
    storm_text,
)
from vramlab.report.sections import ReportContext, Section

EDIT = "_(derived from the data; operator: edit)_"
K = EventKind
TIMELINE_KINDS = (
    K.STEP,
    K.OOM,
    K.STARTUP_REFUSAL,
    K.PROCESS_EXIT,
    K.HEALTH,
    K.DETECT,
    K.STOP_CONDITION,
    K.FAULT,
    K.ALERT,
    K.MITIGATION,
    K.RAMP_UNDONE,
    K.RECOVERED,
    K.NOT_RECOVERED,
    K.NOTE,
    K.RETRY_STORM,
    K.WAITING_FOR_OPERATOR,
    K.RECOVERY_COMMAND,
    K.XID,
    K.OVERLOAD,
    K.PREEMPTION,
    K.CEILING,
    K.ROLLBACK,
    K.COTENANT,
    K.COTENANT_OOM,
    K.CAPACITY,
    K.WARNING,
    K.ENGINE,
    K.RACE,
    K.LEDGER,
    K.HEALTH_PATH,
    K.TARGET_READY,
    K.FAILURE_MODE,
    K.STOPPED,
    K.MODEL_LOAD,
    K.MODEL_UNLOAD,
    K.MODEL_OFFLOAD,
)
MODEL_KINDS = (K.MODEL_LOAD, K.MODEL_UNLOAD, K.MODEL_OFFLOAD)  # Ollama loaded or unloaded it (/api/ps)


def _is_drill(ctx: ReportContext) -> bool:
    return ctx.run.kind == "drill"


def summary_line(ctx: ReportContext) -> str:
    inc, _ = incident_of(ctx)
    unit = _unit(ctx)
    if not inc.failed:
        stopped = next((e for e in ctx.events if e.kind == K.STOPPED), None)
        if stopped is not None and inc.ceiling is None:
            return stopped.message  # the drill's time ran out before the ramp's end: no ceiling claim
        top = (inc.ceiling or {}).get("value")
        added, bad, which = refused_on_ramp(ctx)
        if bad:
            return (
                f"no OOM of the running target up to {fmt.num(top)} {unit}, but {bad} of {added} added "
                f"models did not start ({', '.join(which)}): the card did not hold them"
            )
        return ceiling_line(ctx, top, unit)
    rec_txt = recovery_text(inc.recovery, inc.t0_s)
    first = inc.signals.first
    return (
        f"{inc.failure_mode} {failure_where(inc, unit)}; detected {_s(from_t0(inc.time_to_detect_s, inc.t0_s))} after T0; first abnormal signal "
        f"{first.name if first else '–'}; {inc.impact.failed} failed requests; {rec_txt}"
    )


def s_summary(ctx: ReportContext) -> list[Block]:
    inc, rounds = incident_of(ctx)
    items = [
        f"**{summary_line(ctx)}**",
        f"Drill `{ctx.run.run_id}` status {ctx.run.status}; {len(rounds)} round(s); "
        f"{sum(1 for r in rounds if r.failed)} failed",
        "Status: draft postmortem — action items below need an owner's confirmation",
    ]
    if ctx.run.stop_reason:
        items.append(f"Ended by: {ctx.run.stop_reason}")
    from vramlab.report.prompt_tokens import prompt_tokens_line
    from vramlab.report.window_tables import host_line

    items += [line for line in (host_line(ctx), prompt_tokens_line(ctx)) if line]
    return [Bullets(items)]


def s_impact(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    i = inc.impact
    if inc.t0_s is None:
        return [Table(["impact", "value"], impact_without_failure(ctx))]
    rows = [
        ["requests sent from T0 until recovery", str(i.requests_during)],
        ["failed attempts", str(i.failed)],
        ["in-flight requests lost at the failure", str(i.in_flight_lost)],
        ["requests that never succeeded (after retries)", str(i.failed_logical)],
        ["affected clients", str(i.affected_clients)],
        ["errors by class", ", ".join(f"{k} {v}" for k, v in sorted(i.error_classes.items())) or "–"],
        [
            "E2E P95 baseline / incident / after (ms)",
            f"{fmt.ms(i.baseline_p95_ms)} / {fmt.ms(i.incident_p95_ms)} / {fmt.ms(i.after_p95_ms)}",
        ],
    ]
    return [Table(["impact", "value"], rows)]


def s_timeline(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    t0 = inc.t0_s
    rows = []
    for e in ctx.events:
        if e.kind not in TIMELINE_KINDS:
            continue
        if e.kind == K.ALERT and alert_data(e).get("state") not in ("pending", "firing"):
            continue
        rel = since_t0(e.t_s, t0)
        who = "operator" if e.kind == K.NOTE else ("alert" if e.kind == K.ALERT else "drill")
        who = "target" if e.kind in MODEL_KINDS else who
        what, kind = e.message, e.kind
        if e.kind == K.RECOVERED and inc.recovery.recovered:
            what += f" — {recovery_text(inc.recovery, t0)}"
        elif e.kind == K.RECOVERED:
            # the drill's event means it served again; the incident is not recovered until P95 and health are back
            kind, what = "serving again", f"{what} — {recovery_text(inc.recovery, t0)}"
        # the live 1 s peak; the one figure every section quotes is the window's
        elif e.kind == K.RETRY_STORM:
            storm = retry_storm_data(e)
            what = storm_text(inc.retry_storm) + (
                f" (live: one {fmt.num(storm.get('window_s', 1.0))} s window crossed "
                f"{fmt.num(round(float(storm.get('amplification') or 0.0), 2))}× here)"
            )
        rows.append([f"{e.t_s:.2f}", rel, kind, who, what])
    return [
        Text(
            f"Times in seconds from the drill's start, and from T0 ({T0_WORDS}). "
            "Operator notes come from `vramlab note`."
        ),
        Table(["t (s)", "T0 + (s)", "event", "by", "what"], rows),
    ]


def s_recovery(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    if not inc.failed:
        return []
    r = inc.recovery

    def clock(d: float | None) -> str:
        return _s(from_t0(d, inc.t0_s))

    rows = [
        ["T0", T0_WORDS, "0.00 s"],
        ["time to detect", "T0 → first detection by the drill", clock(inc.time_to_detect_s)],
        ["time to alert", "T0 → first alert firing", alert_clock(inc)],
        [
            "time to mitigate",
            "T0 → first corrective action (restart, script, operator)",
            clock(inc.time_to_mitigate_s),
        ],
        [
            "health 200 again",
            "T0 → health OK after it failed" if r.health_failed else "health never failed",
            clock(r.health_ok_s),
        ],
        ["first successful generation", "T0 → first 2xx request after the failure", clock(r.first_success_s)],
        [
            "P95 back within tolerance",
            "T0 → end of the first window with P95 ≤ (1+tol) × baseline P95",
            clock(r.p95_ok_s),
        ],
        ["time to recover", "T0 → the latest of the three clocks above", clock(r.time_to_recover_s)],
    ]
    text = recovery_text(r, inc.t0_s)
    verdict = (
        f"{text[0].upper()}{text[1:]}."
        if r.recovered
        else f"**Not recovered**: {not_recovered_reason(r, inc.t0_s)}; the rollback still ran."
    )
    return [Text(verdict), Table(["figure", "boundary", "value"], rows)]


def s_blast(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    if not inc.neighbours:
        return [Text("No neighbours declared in the plan: blast radius not measured.")]
    rows = [
        [
            n.name,
            fmt.pct(n.baseline_error_rate),
            fmt.pct(n.incident_error_rate),
            fmt.ms(n.baseline_p95_ms),
            fmt.ms(n.incident_p95_ms),
            str(n.probes_during),
            "yes" if n.affected else "no",
        ]
        for n in inc.neighbours
    ]
    return [
        Table(
            [
                "neighbour",
                "error rate baseline",
                "error rate incident",
                "P95 ms baseline",
                "P95 ms incident",
                "probes",
                "affected",
            ],
            rows,
        )
    ]


def s_storm(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    s = inc.retry_storm
    policy = plan_section(ctx, Retry, "load", "retry").policy
    rows = [
        ["client retry policy", str(policy)],
        ["baseline offered rate (original requests)", f"{fmt.rate(s.baseline_rate_rps)} /s"],
        ["attempt rate during recovery", f"{fmt.rate(s.recovery_rate_rps)} /s"],
        [
            "amplification (attempt rate / baseline offered rate)",
            "–" if s.amplification is None else f"{s.amplification:.2f}×",
        ],
        ["peak (the busiest second's attempts / baseline offered rate)", peak_text(s, inc.t0_s)],
        [
            "during recovery: new user requests / the policy's retries",
            f"{s.new_requests} / {s.retries_in_window}",
        ],
        [
            "attempts per original request",
            "–" if s.attempts_per_request is None else f"{s.attempts_per_request:.2f}",
        ],
        [
            "new-request rate / baseline offered rate",
            "–" if s.new_request_ratio is None else f"{s.new_request_ratio:.2f}×",
        ],
        ["retries sent from T0", str(s.retries)],
        ["retry storm", "yes" if s.storm else "no"],
        ["second OOM after recovery", "yes" if s.second_oom else "no"],
        ["preemptions during recovery", fmt.num(s.preemptions_during_recovery)],
    ]
    out: list[Block] = [Table(["retry storm", "value"], rows)]
    if not s.storm and s.new_request_ratio is not None and s.new_request_ratio >= 2:
        out.append(
            Text(
                f"Not a retry storm: the extra traffic is new requests ({s.new_request_ratio:.1f}× the "
                "baseline's rate) from closed-loop users whose previous request failed at once, not retries."
            )
        )
    return out


def s_lessons(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    well, wrong, lucky = lessons(inc)
    out: list[Block] = [Text(EDIT)]
    for title, items in (("What went well", well), ("What went wrong", wrong), ("Where we got lucky", lucky)):
        out += [Text(f"**{title}**"), Bullets(items or ["(nothing derived; operator: add)"])]
    return out


def s_actions(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    rows = action_items(ctx, inc)
    if not rows:
        return [Text("No action items derived. " + EDIT)]
    return [Table(["action", "type", "owner"], rows, caption="Owners come from the plan's alert rules")]


def s_rounds(ctx: ReportContext) -> list[Block]:
    _, rounds = incident_of(ctx)
    rows = [
        [
            str(r.round),
            r.failure_mode,
            fmt.num((r.failure_step or {}).get("value")),
            _s(from_t0(r.time_to_detect_s, r.t0_s)),
            _s(from_t0(r.recovery.time_to_recover_s, r.t0_s)),
            str(r.impact.failed),
        ]
        for r in rounds
    ]
    vals = {(r.failure_step or {}).get("value") for r in rounds}
    ttrs = [r.recovery.time_to_recover_s for r in rounds if r.recovery.time_to_recover_s is not None]
    stable = len(rounds) >= 2 and len(vals) == 1 and (not ttrs or max(ttrs) <= 1.5 * min(ttrs) + 0.5)
    verdict = (
        "Only one round: stability across rounds is not known (the method asks for three)."
        if len(rounds) < 2
        else (
            "Stable: same failing step and similar recovery in every round."
            if stable
            else "Not stable: the rounds differ; treat single figures with care."
        )
    )
    return [Text(verdict), Table(["round", "failure mode", "failing value", "TTD", "TTR", "failed"], rows)]


def unrecovered(ctx: ReportContext) -> list[Incident]:
    """The rounds that failed and did not recover, by the report's own verdict (health, serving
    and P95 back): what `vramlab drill` exits 1 on, so its exit code never disagrees with the report."""
    return [r for r in incident_of(ctx)[1] if r.failed and not r.recovery.recovered]


def incident_json(ctx: ReportContext) -> Any:
    inc, rounds = incident_of(ctx)
    return {
        "headline": inc.to_json(),
        "rounds": [r.to_json() for r in rounds],
        "summary": summary_line(ctx),
        "recovered": not unrecovered(ctx),
    }


SECTIONS = (
    Section("incident", "Incident summary", s_summary, order=11, applies=_is_drill, data=incident_json),
    Section("incident-impact", "Impact", s_impact, order=12, applies=_is_drill),
    Section("incident-timeline", "Timeline", s_timeline, order=13, applies=_is_drill),
    Section(
        "incident-detection",
        "Detection: first abnormal signal and alerts",
        s_detection,
        order=14,
        applies=_is_drill,
    ),
    Section("incident-cause", "Root cause and trigger", s_cause, order=15, applies=_is_drill),
    Section("incident-recovery", "Resolution and recovery", s_recovery, order=16, applies=_is_drill),
    Section("incident-blast", "Blast radius", s_blast, order=17, applies=_is_drill),
    Section("incident-storm", "Retry storm", s_storm, order=18, applies=_is_drill),
    Section("incident-lessons", "Lessons learned", s_lessons, order=19, applies=_is_drill),
    Section("incident-actions", "Action items", s_actions, order=19.5, applies=_is_drill),
    Section("incident-rounds", "Rounds compared", s_rounds, order=19.7, applies=_is_drill),
)

__all__ = ["SECTIONS", "incident_json", "incident_of", "summary_line", "unrecovered"]
