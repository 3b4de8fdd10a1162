"""Two runs side by side: are they comparable (same fixed part), and what moved."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from vramlab.analysis.rounds import KEY_METRICS
from vramlab.analysis.run import RunAnalysis
from vramlab.analysis.windows import PHASE_ORDER

# Fixed-part fields that make two runs different experiments when they differ.
FIXED_KEYS = ("engine", "engine_version", "model", "gpu_name")


@dataclass(frozen=True)
class MetricDelta:
    phase: str
    step: str  # the changed variable's value (or step index), "" for a whole phase
    metric: str
    a: float
    b: float

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def rel(self) -> float | None:
        return (self.b - self.a) / abs(self.a) if self.a else None


@dataclass(frozen=True)
class RunComparison:
    a_id: str
    b_id: str
    differences: list[str]  # why the fixed parts differ; empty when comparable
    deltas: list[MetricDelta] = field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return not self.differences


# What an experiment's plan_hash covers (experiment/standard.py); a drill's covers its whole plan.
HASHED_PARTS = ("fixed", "load", "phases", "target.model", "target.api")
SHOWN_FIELDS = 4


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested document as dotted paths -> leaf values."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def plan_fields_that_differ(a: dict[str, Any], b: dict[str, Any], kind: str) -> list[str]:
    """The stored plans' fields (dotted paths) whose values differ, within what the plan hash covers."""
    fa, fb = flatten(a), flatten(b)
    keys = sorted(set(fa) | set(fb))
    if kind == "experiment":
        keys = [k for k in keys if k == "target.model" or k.startswith(tuple(p + "." for p in HASHED_PARTS))]
    else:
        keys = [k for k in keys if k != "name"]
    return [f"{k} {fa.get(k)!r} vs {fb.get(k)!r}" for k in keys if fa.get(k) != fb.get(k)]


def fixed_differences(a: RunAnalysis, b: RunAnalysis) -> list[str]:
    out = []
    if a.run.plan_hash != b.run.plan_hash:
        fields = plan_fields_that_differ(a.run.plan, b.run.plan, a.run.kind)
        shown = ", ".join(fields[:SHOWN_FIELDS]) + (
            f" and {len(fields) - SHOWN_FIELDS} more" if len(fields) > SHOWN_FIELDS else ""
        )
        out.append(
            f"plan_hash {a.run.plan_hash[:12] or '-'} vs {b.run.plan_hash[:12] or '-'}: "
            + (shown or "the stored plans show no field that differs (a plan stored by an older vramlab)")
        )
    for key in FIXED_KEYS:
        va, vb = a.run.fixed.get(key), b.run.fixed.get(key)
        if va != vb:
            out.append(f"{key} {va!r} vs {vb!r}")
    return out


def _cells(an: RunAnalysis, names: tuple[str, ...] = KEY_METRICS) -> dict[tuple[str, str], dict[str, float]]:
    """(phase, step label) -> metric -> median over rounds."""
    per: dict[tuple[str, str], dict[str, list[float]]] = {}
    for res in an.steps:
        w = res.window
        label = (
            f"{w.step_value:g}"
            if w.step_value is not None
            else ("" if w.phase != "treatment" else str(w.step))
        )
        cell = per.setdefault((w.phase, label), {})
        for k, v in res.metrics().items():
            if k in names:
                cell.setdefault(k, []).append(v)
    return {key: {m: statistics.median(vs) for m, vs in ms.items()} for key, ms in per.items()}


def requests_per_cell(an: RunAnalysis) -> dict[tuple[str, str], float]:
    """(phase, step label) -> the median number of requests a window of it held, over rounds."""
    return {k: v["requests"] for k, v in _cells(an, ("requests",)).items() if "requests" in v}


def compare_runs(a: RunAnalysis, b: RunAnalysis) -> RunComparison:
    ca, cb = _cells(a), _cells(b)
    deltas = []
    keys = sorted(set(ca) & set(cb), key=lambda k: (PHASE_ORDER.get(k[0], 9), _num(k[1]), k[1]))
    for key in keys:
        for metric in KEY_METRICS:
            if metric in ca[key] and metric in cb[key]:
                deltas.append(MetricDelta(key[0], key[1], metric, ca[key][metric], cb[key][metric]))
    for metric, va, vb in (
        ("all.error_rate", a.totals.error_rate, b.totals.error_rate),
        (
            "all.e2e_p95_ms",
            a.totals.e2e.p95 if a.totals.e2e else None,
            b.totals.e2e.p95 if b.totals.e2e else None,
        ),
    ):
        if va is not None and vb is not None:
            deltas.append(MetricDelta("all", "", metric.split(".", 1)[1], va, vb))
    return RunComparison(a.run.run_id, b.run.run_id, fixed_differences(a, b), deltas)


def _num(label: str) -> float:
    try:
        return float(label)
    except ValueError:
        return -1.0
