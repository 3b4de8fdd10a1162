"""`vramlab compare` of two runs that differ in one thing (the engine version, or a declared
variable): memory composition and latency side by side, the plan's predicted difference beside
the measured one, the release rules the plans cross, and the verdict. Text and JSON
(`"schema": "vramlab.regression/1"`, docs/store-and-reports.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramlab.analysis.composition import LABELS
from vramlab.analysis.regression import Regression
from vramlab.records import EventRecord
from vramlab.records.events import EventKind, capacity_plan_data
from vramlab.report.comparison import render_text as render_deltas
from vramlab.units import size

SCHEMA = "vramlab.regression/1"


def stored_plan(events: Sequence[EventRecord]) -> dict[str, Any] | None:
    """The capacity plan a run stored (`capacity_plan` event): `plan --json` of its own settings."""
    for e in reversed(events):
        if e.kind == EventKind.CAPACITY_PLAN:
            est = capacity_plan_data(e).get("estimate")
            return est if isinstance(est, dict) else None
    return None


def plan_changes(plan_a: dict[str, Any] | None, plan_b: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What the two stored plans differ in, each change with the release rules that move it
    (capacity/regression.py, as `vramlab plan --vs-engine-version` says it); [] without both plans."""
    if plan_a is None or plan_b is None:
        return []
    from vramlab.capacity.estimate_json import estimate_from_json
    from vramlab.capacity.regression import changes_between
    from vramlab.capacity.rules import crossed
    from vramlab.errors import ConfigError

    try:
        a, b = estimate_from_json(plan_a), estimate_from_json(plan_b)
    except ConfigError:
        return []
    rules = tuple(crossed(a.engine, a.engine_version, b.engine_version)) if a.engine == b.engine else ()
    return [c.to_json() for c in changes_between(a, b, rules)]


def _b(v: int | None) -> str:
    return "–" if v is None else size(v)


def _signed(v: int | None) -> str:
    if v is None:
        return "–"
    return ("+" if v > 0 else "-" if v < 0 else "") + size(abs(v))


def render_text(r: Regression, a_id: str, b_id: str, changes: list[dict[str, Any]]) -> str:
    s = r.subject
    lines = [
        f"regression comparison: {a_id} vs {b_id}, which differ only in {s.key}: {s.a!r} -> {s.b!r}",
        f"verdict: {r.verdict}" + (f": {'; '.join(r.reasons)}" if r.reasons else ""),
        *(f"note: {n}" for n in r.notes),
        "",
        "memory composition (measured from each run's own readings; planned: each run's stored plan)",
    ]
    head = [
        "figure",
        f"{a_id} measured",
        f"{b_id} measured",
        "measured change",
        f"{a_id} plan",
        f"{b_id} plan",
    ]
    head.append("planned change")
    rows = [
        [
            LABELS.get(m.figure, m.figure),
            _b(m.measured_a),
            _b(m.measured_b),
            _signed(m.measured_delta),
            _b(m.predicted_a),
            _b(m.predicted_b),
            _signed(m.predicted_delta),
        ]
        for m in r.memory
    ]
    lines += _table(head, rows) if rows else ["  (neither run measured or planned its memory)"]
    if changes:
        lines += ["", "what the plan says moved between them, and the release rules behind it"]
        lines += _table(
            ["item", a_id, b_id, "release rules"],
            [[c["item"], _value(c, c["a"]), _value(c, c["b"]), _rules(c)] for c in changes],
            left=(0, 3),
        )
    lines += ["", "latency and errors per phase and step (medians over rounds)"]
    return "\n".join(lines) + "\n" + render_deltas(_as_comparison(r, a_id, b_id))


_BYTES = ("kv_cache", "budget_bytes", "used_bytes", "headroom_bytes")


def _value(change: dict[str, Any], v: Any) -> str:
    if (
        isinstance(v, int)
        and not isinstance(v, bool)
        and (change["kind"] == "component" or change["item"] in _BYTES)
    ):
        return size(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _rules(change: dict[str, Any], shown: int = 3) -> str:
    rules = list(change["rules"])
    if not rules:
        return "through " + ", ".join(change["through"]) if change["through"] else "unexplained"
    more = f" and {len(rules) - shown} more" if len(rules) > shown else ""
    return ", ".join(rules[:shown]) + more


def _as_comparison(r: Regression, a_id: str, b_id: str) -> Any:
    from vramlab.analysis.compare import RunComparison

    return RunComparison(a_id, b_id, [], list(r.latency))


def _table(head: list[str], rows: list[list[str]], left: tuple[int, ...] = (0,)) -> list[str]:
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    out = [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [head, *rows]
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def to_json(r: Regression, a_id: str, b_id: str, changes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "a": a_id,
        "b": b_id,
        "subject": {"key": r.subject.key, "a": r.subject.a, "b": r.subject.b},
        "verdict": r.verdict,
        "reasons": r.reasons,
        "notes": r.notes,
        "memory": [
            {
                "figure": m.figure,
                "measured_a_bytes": m.measured_a,
                "measured_b_bytes": m.measured_b,
                "measured_delta_bytes": m.measured_delta,
                "predicted_a_bytes": m.predicted_a,
                "predicted_b_bytes": m.predicted_b,
                "predicted_delta_bytes": m.predicted_delta,
                "source_a": m.source_a,
                "source_b": m.source_b,
            }
            for m in r.memory
        ],
        "plan_changes": changes,
        "latency": [
            {
                "phase": d.phase,
                "step": d.step,
                "metric": d.metric,
                "a": d.a,
                "b": d.b,
                "delta": d.delta,
                "rel": d.rel,
            }
            for d in r.latency
        ],
    }


__all__ = ["SCHEMA", "plan_changes", "render_text", "stored_plan", "to_json"]
