"""The "Tenants" section: a conversations run's tenants, step by step, each against its own SLO,
with its goodput (the requests and output tokens inside its latency limits)."""

from __future__ import annotations

import dataclasses
from typing import Any

from vramlab.report import fmt
from vramlab.report.blocks import Block, Table, Text
from vramlab.report.sections import ReportContext, Section


def s_tenants(ctx: ReportContext) -> list[Block]:
    rows = []
    for t in ctx.analysis.tenants:
        r = t.requests
        seen = ", ".join(
            f"{k} {'–' if v is None else f'{v:.3g}'} (<= {t.slo[k]:g})" for k, v in t.observed.items()
        )
        verdict = "–" if t.meets is None else ("meets" if t.meets else "fails: " + ", ".join(t.broken))
        rows.append(
            [
                str(t.round),
                t.phase,
                "–" if t.step is None else str(t.step),
                fmt.num(t.step_value),
                t.tenant,
                str(r.count),
                fmt.rate(r.goodput_rps),
                fmt.rate(r.goodput_tok_s),
                seen,
                verdict,
            ]
        )
    var = ctx.run.change.get("variable", "value")
    head = [
        "round",
        "phase",
        "step",
        var,
        "tenant",
        "requests",
        "goodput req/s",
        "goodput tok/s",
        "observed",
        "SLO",
    ]
    return [
        Text("Each tenant's requests in each window, against the tenant's own SLO."),
        Table(head, rows, caption="Tenants"),
    ]


def tenants_json(ctx: ReportContext) -> Any:
    return [
        {
            **{k: v for k, v in dataclasses.asdict(t).items() if k != "requests"},
            "meets": t.meets,
            "requests": dataclasses.asdict(t.requests),
        }
        for t in ctx.analysis.tenants
    ]


SECTIONS = (
    Section(
        "tenants",
        "Tenants and their SLOs",
        s_tenants,
        order=56,
        applies=lambda ctx: bool(ctx.analysis.tenants),
        data=tenants_json,
    ),
)

__all__ = ["SECTIONS", "s_tenants", "tenants_json"]
