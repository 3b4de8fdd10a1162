"""Report section "Plan against measured": the memory composition per step and round, the capacity
plan's prediction (with its band) beside the measurement (with its source), the error and where
it comes from; the predicted KV saturation point beside the observed one; a drill's composition
at the failure. The JSON form is `sections.composition` (docs/store-and-reports.md)."""

from __future__ import annotations

from typing import Any

from vramlab.analysis.composition import FIGURES, LABELS, Composition, Figure, Row, compose
from vramlab.analysis.saturation import Hit, Saturation
from vramlab.records.events import EventKind
from vramlab.report import fmt
from vramlab.report.blocks import Block, Bullets, Table, Text
from vramlab.report.sections import ReportContext, Section
from vramlab.units import SMALL_BYTES, size

SCHEMA = "vramlab.composition/1"


def composition_of(ctx: ReportContext) -> Composition:
    """The run's composition, computed once per report (its blocks and its JSON share it)."""
    return ctx.memo("composition", lambda: _compose(ctx))


def _compose(ctx: ReportContext) -> Composition:
    a = ctx.analysis
    sent = [r.sent_s for r in ctx.requests if r.sent_s is not None]
    windows = [w.window for w in a.steps] or [w.window for w in a.phases]
    return compose(ctx.run, ctx.samples, ctx.events, windows, min(sent) if sent else None, ctx.requests)


def _applies(ctx: ReportContext) -> bool:
    return any(e.kind in (EventKind.CAPACITY_PLAN, EventKind.STARTUP_MEMORY) for e in ctx.events)


def _where(r: Row) -> str:
    step = "" if r.step is None or r.phase in ("baseline", "recovery") else f" step {r.step}"
    value = "" if r.step_value is None else f" ({fmt.num(r.step_value)})"
    return f"{r.phase}{step}{value}"


def band_text(f: Figure) -> str:
    """The prediction with its band, in the table's units (MiB for a small figure)."""
    if f.predicted_bytes is None:
        return "–"
    if abs(f.predicted_bytes) < SMALL_BYTES:  # a small model's MiB, with the unit (GiB reads 0.00)
        return f"{size(f.predicted_bytes)} ({size(f.low_bytes)}–{size(f.high_bytes)})"
    return f"{fmt.gib(f.predicted_bytes)} ({fmt.gib(f.low_bytes)}–{fmt.gib(f.high_bytes)})"


def _measured(f: Figure) -> str:
    if f.measured_bytes is None and f.measured_tokens is not None:
        return f"{f.measured_tokens:,} tokens"
    return sized(f.measured_bytes)


def _error(f: Figure) -> str:
    if f.error_bytes is None and f.error_tokens is not None:
        return f"{f.error_tokens:+,} tokens"
    return sized(f.error_bytes, sign=True)


def sized(b: int | None, sign: bool = False) -> str:
    """GiB as the column says; a figure under what two GiB decimals show carries its MiB unit."""
    if b is not None and b and abs(b) < SMALL_BYTES:
        return size(b, sign=sign)
    return fmt.gib(b, sign=sign)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1f}%"


def _yes(v: bool | None) -> str:
    return "–" if v is None else ("yes" if v else "no")


def _figure_rows(r: Row, label: str) -> list[list[str]]:
    out = []
    for name in FIGURES:
        f = r.figure(name)
        src = f.source + (" [host memory]" if f.host_memory else "")
        out.append(
            [
                label,
                LABELS[name],
                band_text(f),
                _measured(f),
                _error(f),
                _pct(f.error_pct),
                _yes(f.inside_band),
                src or "not measured",
                r.error_source() if name == "peak" else "",
            ]
        )
    return out


HEADERS = [
    "Round / window",
    "Figure",
    "Predicted GiB (band)",
    "Measured GiB",
    "Error GiB",
    "Error %",
    "In band",
    "Measured from",
    "Where the error comes from",
]


def blocks(ctx: ReportContext) -> list[Block]:
    c = composition_of(ctx)
    out: list[Block] = []
    intro = []
    if c.plan:
        settings = c.plan_facts.settings if c.plan_facts else None
        intro.append(
            f"Plan: {c.plan.model} on {c.plan.gpu}, {c.plan.engine} {c.plan.engine_version}"
            + (f", settings {settings}" if settings else "")
            + "; computed at the start of the run for the target's own settings. Error = predicted − "
            "measured (positive: the plan expected more)."
        )
    else:
        intro.append(
            "No capacity plan was stored with this run: "
            + ("; ".join(c.notes) or "its facts were not known")
            + ". Measured figures only."
        )
    if c.startup_source:
        intro.append(f"Start-up figures from {c.startup_source}.")
    if any(f.host_memory for r in c.rows for f in r.figures):
        intro.append("The peak is host memory (the target process's RSS): this engine ran on the CPU.")
    out.append(Bullets(intro))
    rows = [x for r in c.rows for x in _figure_rows(r, f"round {r.round} {_where(r)}")]
    out.append(
        Table(
            HEADERS,
            rows,
            caption="Resident model, KV cache, runtime overhead and peak per step and round "
            "(GiB = 2^30 bytes)",
        )
    )
    kv = [
        [
            f"round {r.round} {_where(r)}",
            sized(r.kv_used_bytes),
            "–" if r.kv_used_tokens is None else f"{r.kv_used_tokens:,}",
            "–" if r.kv_usage_max is None else f"{r.kv_usage_max * 100:.1f}%",
            r.kv_used_source or "not measured",
        ]
        for r in c.rows
    ]
    out.append(
        Table(
            ["Round / window", "KV in use GiB", "KV in use tokens", "KV usage (max)", "Measured from"],
            kv,
            caption="KV cache in use (the highest in the window)",
        )
    )
    s = c.saturation
    if s is not None:
        pred = "–" if s.predicted_value is None else fmt.num(s.predicted_value)

        out.append(
            Bullets(
                [
                    f"Predicted saturation: {s.variable} {pred} ({s.predicted_basis})",
                    f"Observed: the pool full (KV usage at 98 % or more, or requests waiting with less room than one "
                    f"request): {_seen(s.variable, s.kv_full)}; first preemption: "
                    f"{_seen(s.variable, s.preemption)}; requests queued for most of a window: "
                    f"{_seen(s.variable, s.queueing)}; requests refused for their length: "
                    f"{_seen(s.variable, s.refusal)}",
                    "Saturation observed "
                    + ("in no step of this run" if s.observed is None else _seen(s.variable, s.observed)),
                    _apart(s),
                ]
            )
        )
    for value, r in c.at_failure:
        out.append(
            Text(
                f"Composition at the failure (round {r.round}, {fmt.num(value)}), from the step's start to "
                f"the failure's first evidence at {r.end_s:.2f} s:"
            )
        )
        out.append(Table(HEADERS, _figure_rows(r, f"round {r.round} at the failure")))
    return out


def _seen(variable: str, hit: Hit | None) -> str:
    if hit is None:
        return "not in this run"
    step = "" if hit.step is None else f"step {hit.step}, "
    return f"from {step}{variable} {fmt.num(hit.value)} (round {hit.round})" + (
        f": {hit.detail}" if hit.detail else ""
    )


def _apart(s: Saturation) -> str:
    """Predicted against observed, in the ramp's steps."""
    var, pred = s.variable, s.predicted_step_value
    where = (
        "no prediction"
        if s.predicted_value is None
        else (
            f"predicted beyond the last step ({fmt.num(s.step_values[-1])})"
            if pred is None and s.step_values
            else f"predicted at the step {var} {fmt.num(pred)} (the first at or past {fmt.num(s.predicted_value)})"
        )
    )
    seen = "not observed" if s.observed is None else f"observed at {var} {fmt.num(s.observed.value)}"
    apart = "" if s.steps_apart is None else f": {s.steps_apart} step(s) apart"
    return f"Predicted against observed: {where}; {seen}{apart}"


def _hit_json(hit: Hit | None) -> dict[str, Any] | None:
    if hit is None:
        return None
    return {"value": hit.value, "round": hit.round, "step": hit.step, "detail": hit.detail or None}


def _fig_json(f: Figure) -> dict[str, Any]:
    return {
        "predicted_bytes": f.predicted_bytes,
        "low_bytes": f.low_bytes,
        "high_bytes": f.high_bytes,
        "measured_bytes": f.measured_bytes,
        "error_bytes": f.error_bytes,
        "error_pct": None if f.error_pct is None else round(f.error_pct, 3),
        "inside_band": f.inside_band,
        "source": f.source or None,
        "host_memory": f.host_memory,
        "predicted_tokens": f.predicted_tokens,
        "measured_tokens": f.measured_tokens,
        "error_tokens": f.error_tokens,
    }


def _row_json(r: Row) -> dict[str, Any]:
    return {
        "round": r.round,
        "phase": r.phase,
        "step": r.step,
        "step_value": r.step_value,
        "start_s": r.start_s,
        "end_s": r.end_s,
        "figures": {f.name: _fig_json(f) for f in r.figures},
        "kv_in_use": {
            "bytes": r.kv_used_bytes,
            "tokens": r.kv_used_tokens,
            "usage_max": r.kv_usage_max,
            "source": r.kv_used_source or None,
        },
        "preempted": r.preempted,
        "queued": r.queued,
        "error_source": r.error_source(),
    }


def data(ctx: ReportContext) -> dict[str, Any]:
    c = composition_of(ctx)
    s = c.saturation
    return {
        "schema": SCHEMA,
        "plan": c.plan.document if c.plan else None,
        "plan_facts": c.plan_facts.to_json() if c.plan_facts else None,
        "plan_notes": c.notes,
        "startup": {"source": c.startup_source, "observation": c.startup.document} if c.startup else None,
        "rows": [_row_json(r) for r in c.rows],
        "saturation": None
        if s is None
        else {
            "variable": s.variable,
            "predicted_value": s.predicted_value,
            "predicted_basis": s.predicted_basis,
            "binding": s.binding or None,
            "observed_value": s.observed_value,
            "observed": _hit_json(s.observed),
            "kv_full": _hit_json(s.kv_full),
            "preemption": _hit_json(s.preemption),
            "queueing": _hit_json(s.queueing),
            "refusal": _hit_json(s.refusal),
            "step_values": list(s.step_values),
            "predicted_step_value": s.predicted_step_value,
            "observed_step_value": s.observed_value,
            "steps_apart": s.steps_apart,
        },
        "at_failure": [{"value": v, **_row_json(r)} for v, r in c.at_failure],
    }


SECTIONS = (
    Section(
        "composition",
        "Plan against measured: memory composition",
        blocks,
        order=56,
        applies=_applies,
        data=data,
    ),
)
