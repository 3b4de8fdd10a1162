"""JSON renderer: the analysis as data, schema "vramlab.report/1" (documented in docs/store-and-reports.md)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, cast

from vramlab.analysis.stats import ITL_UNTIMED_WARN, RequestSummary
from vramlab.analysis.windows import WindowResult
from vramlab.report.sections import Document, ReportContext

SCHEMA = "vramlab.report/1"


def itl_gaps(r: RequestSummary) -> dict[str, Any]:
    """The inter-token gaps the ITL figures rest on: timed, untimed (None: not recorded), their
    share, and whether the window is marked (over ITL_UNTIMED_WARN untimed)."""
    return {
        "timed": r.itl_timed,
        "untimed": r.itl_untimed,
        "untimed_share": r.itl_untimed_share,
        "marked": r.itl_few_timed,
        "mark_above_share": ITL_UNTIMED_WARN,
    }


def _window(res: WindowResult) -> dict[str, Any]:
    w = res.window
    return {
        "round": w.round,
        "phase": w.phase,
        "step": w.step,
        "step_value": w.step_value,
        "start_s": w.start_s,
        "end_s": w.end_s,
        "duration_s": w.duration_s,
        "requests": dataclasses.asdict(res.requests),
        "resources": dataclasses.asdict(res.resources),
        "itl_gaps": itl_gaps(res.requests),
    }


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def report_data(ctx: ReportContext, doc: Document) -> dict[str, Any]:
    a = ctx.analysis
    return cast(
        "dict[str, Any]",
        _finite(
            {
                "schema": SCHEMA,
                "run": ctx.run.model_dump(),
                "complete": a.complete,
                "duration_s": a.duration_s,
                "warnings": a.warnings,
                "totals": dataclasses.asdict(a.totals),
                "itl_gaps": itl_gaps(a.totals),
                "phases": [_window(p) for p in a.phases],
                "steps": [_window(s) for s in a.steps],
                "comparisons": [
                    {
                        "round": c.round,
                        "deltas": {
                            phase: {
                                m: {
                                    "baseline": d.baseline,
                                    "value": d.value,
                                    "delta": d.delta,
                                    "ratio": d.ratio,
                                }
                                for m, d in metrics.items()
                            }
                            for phase, metrics in c.deltas.items()
                        },
                    }
                    for c in a.comparisons
                ],
                "stability": [dataclasses.asdict(s) for s in a.stability],
                "recovery": [dataclasses.asdict(r) for r in a.recovery],
                "thresholds": [dataclasses.asdict(c) for c in a.thresholds],
                "highest_passing_value": a.highest_passing_value,
                "search": a.searches,
                "events": [e.model_dump() for e in a.events],
                "sections": {s.id: s.data for s in doc.sections if s.data is not None},
            }
        ),
    )


def render(ctx: ReportContext, doc: Document) -> str:
    return json.dumps(report_data(ctx, doc), indent=2, allow_nan=False) + "\n"
