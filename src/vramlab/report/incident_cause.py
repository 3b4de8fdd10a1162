"""The incident report's detection and cause sections: the first abnormal signal and the order the
others followed, the alerts and their clocks; the failure mode with its quoted evidence, the trigger
step, and the capacity model's predicted limit beside the step that failed."""

from __future__ import annotations

from vramlab.analysis.incident import Incident
from vramlab.records.events import EventKind, capacity_data
from vramlab.report import fmt
from vramlab.report.blocks import Block, Bullets, Table, Text
from vramlab.report.incident_base import incident_of
from vramlab.report.incident_text import (
    OOM_MODES,
    _base_mode,
    _s,
    _unit,
    alert_clock,
    from_t0,
    refused_on_ramp,
    signal_value,
    since_t0,
)
from vramlab.report.sections import ReportContext

K = EventKind


def s_detection(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    sig = inc.signals
    blocks: list[Block] = []
    if sig.first is None:
        blocks.append(Text("No signal left its baseline band after the treatment started."))
    else:
        f = sig.first
        blocks.append(
            Text(
                f"**First abnormal signal:** `{f.name}` ({f.layer} layer) at {f.t_s:.2f} s "
                f"({'' if inc.t0_s is None else f'{since_t0(f.t_s, inc.t0_s)} s from T0; '}"
                f"{f.describe()})."
            )
        )
    rows = [
        [
            o.name,
            o.layer,
            f"{o.t_s:.2f}",
            since_t0(o.t_s, inc.t0_s),
            o.reason,
            signal_value(o.name, o.value),
            signal_value(o.name, o.baseline_mean),
        ]
        for o in sig.order
    ]
    if rows:
        blocks.append(
            Table(
                ["signal", "layer", "onset (s)", "T0 + (s)", "judged by", "value", "baseline mean"],
                rows,
                caption="Order in which signals went abnormal (judged against the baseline phase)",
            )
        )
    if sig.quiet:
        blocks.append(Text("Stayed normal: " + ", ".join(f"`{q}`" for q in sig.quiet)))
    if sig.noisy:
        blocks.append(
            Text(
                "Already past a fixed threshold in the baseline (not counted as causes): "
                + ", ".join(f"`{q}`" for q in sig.noisy)
            )
        )
    blocks.append(
        Text(
            f"Time to detect (T0 → the drill's first detection): **{_s(from_t0(inc.time_to_detect_s, inc.t0_s))}**."
        )
    )
    alert_rows = [
        [a["name"], a["state"], f"{a['t_s']:.2f}", since_t0(a["t_s"], inc.t0_s), a.get("source") or "–"]
        for a in inc.alerts
        if a["state"] in ("pending", "firing")
    ]
    if alert_rows:
        blocks.append(
            Table(
                ["alert", "state", "t (s)", "T0 + (s)", "source"],
                alert_rows,
                caption="Same clock as the timeline; a negative T0 + means before T0",
            )
        )
    blocks.append(
        Text(
            f"Time to alert (T0 → first alert firing): **{alert_clock(inc)}**"
            + (
                ""
                if inc.time_to_alert_s is not None
                else " — no alert fired during the drill (a `for:` longer than the incident never fires)"
            )
        )
    )
    return blocks


def s_cause(ctx: ReportContext) -> list[Block]:
    inc, _ = incident_of(ctx)
    unit = _unit(ctx)
    cap = next((e for e in ctx.events if e.kind == K.CAPACITY), None)
    if not inc.failed:
        top = (inc.ceiling or {}).get("value")
        added, bad, which = refused_on_ramp(ctx)
        stopped = next((e for e in ctx.events if e.kind == K.STOPPED), None)
        out: list[Block] = [
            Text(
                f"No failure of the running target up to {fmt.num(top)} {unit}, but {bad} of "
                f"{added} added models did not start ({', '.join(which)}); see the co-location "
                "table."
                if bad
                else f"No failure, and no boundary found: {stopped.message}. Raise the wall clock "
                "(stop.wall_clock_s) or shorten the steps."
                if stopped is not None and inc.ceiling is None
                else f"No failure: no OOM up to {fmt.num(top)} {unit}. The ramp ended with the stop "
                "conditions armed; raise the ceiling to find the boundary."
            )
        ]
        if cap is not None:
            out.append(Text(f"Capacity model's account: {cap.message}"))
        return out
    step = inc.failure_step or {}
    items = [f"**Failure mode:** {inc.failure_mode}"]
    items += [f"Evidence: {e}" for e in inc.evidence]
    if _base_mode(inc.failure_mode) not in OOM_MODES:
        items.append("No out-of-memory was seen, so this is not called an OOM.")
    trig = inc.trigger
    if trig is not None and trig.step is None:
        items.append(f"**Trigger:** none — {trig.reason}")
    else:
        conf = (
            ""
            if trig is None
            else (
                f" — confidence **{trig.confidence}**: {trig.reason}; the step sent "
                f"{trig.requests_sent} request(s) before T0"
            )
        )
        items.append(
            f"**Trigger:** ramp step {step.get('step')} — {step.get('knob')} = {fmt.num(step.get('value'))} "
            f"{unit} (last safe step: {fmt.num(inc.last_safe_value)} {unit}){conf}"
        )
    during = inc.detected_during or {}
    if during and during.get("step") != step.get("step"):
        items.append(
            f"Detected during ramp step {during.get('step')} ({fmt.num(during.get('value'))} {unit}), "
            "which had not carried the load when the failure began: it is not the trigger"
        )
    sig = inc.signature or {}
    if sig.get("line"):
        items.append(
            f"**Matched failure signature:** `{sig.get('signature') or sig.get('class')}` — "
            f"`{str(sig['line'])}`"
        )
    if cap is not None:
        items.append(f"**Capacity model's account:** {cap.message}")
    items += [line for line in (predicted_limit_line(ctx, inc),) if line]
    return [Bullets(items)]


def predicted_limit_line(ctx: ReportContext, inc: Incident) -> str | None:
    """The capacity model's predicted limit beside the step that failed, and which side it fell on."""
    cap = next((e for e in ctx.events if e.kind == K.CAPACITY), None)
    limit = None if cap is None else capacity_data(cap).get("predicted_limit")
    if limit is None or not inc.failed:
        return None
    failed_at = (inc.failure_step or {}).get("value")
    return (
        f"Predicted limit {fmt.num(limit)} {_unit(ctx)} vs observed failure at {fmt.num(failed_at)} "
        f"(last safe {fmt.num(inc.last_safe_value)}): "
        + prediction_side(limit, failed_at, inc.last_safe_value)
    )


def prediction_side(predicted: float, failed_at: float | None, last_safe: float | None) -> str:
    """Whether a predicted limit would have protected the target: above the value that failed is the
    unsafe side (the model promised room that was not there)."""
    if failed_at is not None and predicted >= failed_at:
        return (
            f"the prediction was on the unsafe side ({fmt.num(predicted)} is at or above the failure at "
            f"{fmt.num(failed_at)})"
        )
    if last_safe is not None and predicted < last_safe:
        return "the prediction was on the safe side (below the last step that held)"
    return "the prediction falls between the last safe step and the failure (consistent with what was seen)"
