"""Renders a run comparison as a plain-text table or JSON data."""

from __future__ import annotations

from typing import Any

from vramlab.analysis.compare import RunComparison
from vramlab.report import fmt


def _value(metric: str, v: float) -> str:
    if metric == "error_rate" or metric.endswith("_perc"):
        return fmt.pct(v)
    if metric.endswith("_bytes"):
        return fmt.gib(v) + " GiB"
    return f"{v:,.2f}"


def render_text(comp: RunComparison) -> str:
    headers = ["phase", "step", "metric", comp.a_id, comp.b_id, "delta", "change"]
    rows = []
    for d in comp.deltas:
        delta = ("+" if d.delta > 0 else "") + _value(d.metric, d.delta)
        rows.append(
            [
                d.phase,
                d.step or "–",
                d.metric,
                _value(d.metric, d.a),
                _value(d.metric, d.b),
                delta,
                "–" if d.rel is None else f"{d.rel * 100:+.1f}%",
            ]
        )
    if not rows:
        return f"runs {comp.a_id} and {comp.b_id} have no phase or step in common\n"
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(
            str(c).ljust(w) if i < 3 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [headers, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def to_json(comp: RunComparison) -> dict[str, Any]:
    return {
        "a": comp.a_id,
        "b": comp.b_id,
        "comparable": comp.comparable,
        "differences": comp.differences,
        "deltas": [
            {
                "phase": d.phase,
                "step": d.step,
                "metric": d.metric,
                "a": d.a,
                "b": d.b,
                "delta": d.delta,
                "rel": d.rel,
            }
            for d in comp.deltas
        ],
    }
