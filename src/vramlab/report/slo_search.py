"""The "SLO search" section: a `change.search` run's answer, its bracket and SLO, and every probe
with its figures and the goodput of its window (the requests and output tokens inside the SLO)."""

from __future__ import annotations

from typing import Any

from vramlab.report import fmt
from vramlab.report.blocks import Block, Table, Text
from vramlab.report.sections import ReportContext, Section


def _v(v: Any) -> str:
    return "–" if v is None else f"{v:g}"


def _figure(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def s_search(ctx: ReportContext) -> list[Block]:
    a = ctx.analysis
    windows = {(w.window.round, w.window.step): w.requests for w in a.steps if w.window.phase == "treatment"}
    out: list[Block] = []
    for s in a.searches:
        var, slo = s.get("variable", "value"), s.get("slo") or {}
        limits = ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
        lo, hi = (s.get("bracket") or [None, None])[:2]
        if "answer" in s:
            said = "none meets it" if s["answer"] is None else f"{s['answer']:g}"
            line = f"Round {s['round']}: the largest {var} meeting {limits} is {said} (bracket {_v(lo)} to {_v(hi)}; "
            out.append(Text(line + f"{len(s['probes'])} probes; {s.get('reason', '')})."))
        else:
            out.append(Text(f"Round {s['round']}: the search for {limits} did not end; its probes so far:"))
        rows = []
        for p in s["probes"]:
            r = windows.get((s["round"], p.get("step")))
            seen = ", ".join(f"{k} {_figure(x)}" for k, x in (p.get("observed") or {}).items())
            rows.append(
                [
                    str(p.get("step", "–")),
                    _v(p.get("value")),
                    str(p.get("requests", "–")),
                    fmt.rate(p.get("throughput_rps")),
                    fmt.rate(r.goodput_rps if r else None),
                    fmt.rate(r.goodput_tok_s if r else None),
                    seen,
                    "meets" if p.get("meets") else "fails: " + ", ".join(p.get("failed") or []),
                ]
            )
        head = ["step", var, "requests", "req/s", "goodput req/s", "goodput tok/s", "observed", "verdict"]
        out.append(Table(head, rows, caption=f"Probes of round {s['round']}, in the order probed"))
    return out


SECTIONS = (
    Section(
        "search",
        "SLO search: the largest load that meets the SLO",
        s_search,
        order=12,
        applies=lambda ctx: bool(ctx.analysis.searches),
        data=lambda ctx: ctx.analysis.searches,
    ),
)

__all__ = ["SECTIONS", "s_search"]
