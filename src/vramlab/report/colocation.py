"""The co-location section of a drill report: per engine, per phase, who started, who refused (with
the engine's text) and who crashed; the start-up race's verdict; the neighbours' probe errors
(blast radius); the ledger after the rollback. Registered for drill runs that have `engine` events.
"""

from __future__ import annotations

from typing import Any

from vramlab.analysis.colocation import PHASES, Colocation, EngineOutcome, analyse_colocation
from vramlab.records.events import EventKind
from vramlab.report.blocks import Block, Bullets, Table, Text
from vramlab.report.sections import ReportContext, Section

_TITLES = {
    "start_in_order": "in start order",
    "race": "all at once (race)",
    "restart_in_order": "in order again",
    "load": "under load",
    "ramp": "ramp and after",
}


def _of(ctx: ReportContext) -> Colocation | None:
    return analyse_colocation(ctx.events, ctx.samples)


def _applies(ctx: ReportContext) -> bool:
    return ctx.run.kind == "drill" and any(e.kind == EventKind.ENGINE for e in ctx.events)


def _cell(o: EngineOutcome | None) -> str:
    if o is None:
        return "–"
    if o.outcome == "started":
        return f"started ({o.ready_s:.2f} s)" if o.ready_s is not None else "started"
    code = f" exit {o.exit_code}" if o.exit_code is not None else ""
    return f"{o.outcome}{code}"


def s_colocation(ctx: ReportContext) -> list[Block]:
    c = _of(ctx)
    if c is None:
        return []
    phases = [p for p in PHASES if any(o.phase == p for o in c.outcomes)]
    rows = [[e, *(_cell(c.cell(e, p)) for p in phases)] for e in c.engines()]
    blocks: list[Block] = [
        Table(
            ["engine", *(_TITLES.get(p, p) for p in phases)],
            rows,
            caption="started (seconds to health 200) / refused / crashed / timeout, per phase",
        )
    ]
    if c.race_failed or c.race_started:
        verdict = (
            f"Start-up race reproduced: {', '.join(c.race_failed)} did not start when started together "
            f"({', '.join(c.race_started) or 'nobody'} did)."
            if c.race_failed
            else "Start-up race: every engine started together (no race seen at these settings)."
        )
        blocks.append(Text(verdict))
    texts = [
        f"{o.phase} · {o.engine} · {o.outcome}: {o.text}"
        for o in c.outcomes
        if o.outcome != "started" and o.text
    ]
    if texts:
        blocks.append(Text("What each engine said when it failed (its own log line):"))
        blocks.append(Bullets(texts))
    if c.neighbours:
        blocks.append(
            Table(
                ["neighbour", "window", "probes", "failed probes"],
                [[n.name, n.window, str(n.probes), str(n.failed)] for n in c.neighbours],
                caption="load: the target under closed-loop load; ramp: models added, until the rollback",
            )
        )
    if c.ledger_used_bytes is not None:
        left = c.drill_pids_left or []
        blocks.append(
            Text(
                f"Ledger after the rollback: {c.ledger_used_bytes} bytes used; "
                + (
                    f"drill processes {left} still hold memory."
                    if left
                    else "no process the drill started holds memory."
                )
            )
        )
    return blocks


def colocation_json(ctx: ReportContext) -> Any:
    c = _of(ctx)
    return None if c is None else c.to_json()


SECTIONS = (
    Section(
        "incident-colocation",
        "Co-location: who started, who failed, and how",
        s_colocation,
        order=11.5,
        applies=_applies,
        data=colocation_json,
    ),
)

__all__ = ["SECTIONS", "colocation_json", "s_colocation"]
