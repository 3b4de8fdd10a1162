"""The drill's incident, computed once per report, and the stored plan's sections read through
the plan's own models: what every incident section (report/incident.py, incident_cause.py) starts from."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from vramlab.analysis.incident import Incident, analyse
from vramlab.plandoc import RecoverySpec
from vramlab.report.sections import ReportContext


def _compute(ctx: ReportContext) -> tuple[Incident, list[Incident]]:
    tol = plan_section(ctx, RecoverySpec, "recovery").p95_tolerance
    rounds = sorted({r.round for r in ctx.requests}) or [0]
    per_round = [analyse(ctx.requests, ctx.samples, ctx.events, tol, round=r) for r in rounds]
    first = next((i for i in per_round if i.failed), per_round[0])
    return first, per_round


def incident_of(ctx: ReportContext) -> tuple[Incident, list[Incident]]:
    """The headline incident (the first round that failed) and every round's, computed once per report."""
    return ctx.memo("incident", lambda: _compute(ctx))


S = TypeVar("S", bound=BaseModel)


def plan_section(ctx: ReportContext, model: type[S], *path: str) -> S:
    """A section of the stored plan read through the plan's own model (its defaults, not repeated
    here); a section a stored plan lacks, or that no longer validates, reads as the model's defaults."""
    data: Any = ctx.plan
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    try:
        return model.model_validate(data or {})
    except ValidationError:
        return model()
