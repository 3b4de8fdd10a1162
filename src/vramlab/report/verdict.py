"""A drill's recovery verdict, by the report's own reading of the store: what `vramlab drill`
exits on, so its exit code never disagrees with the incident report."""

from __future__ import annotations

from collections.abc import Sequence

from vramlab.report.incident import unrecovered
from vramlab.report.incident_text import recovery_text
from vramlab.report.sections import ReportContext


def recovery_verdict(ctx: ReportContext, not_serving: Sequence[int] = ()) -> dict[int, str]:
    """Each round whose target was NOT recovered, with its verdict line: the report's verdict
    (serving, health 200 and P95 back), whatever the live lines said, and the rounds the drill saw
    not serving again within the recovery limit (*not_serving*). Empty: every failure recovered."""
    lost = {
        r.round or 0: f"round {r.round}: {r.failure_mode}; {recovery_text(r.recovery, r.t0_s)}"
        for r in unrecovered(ctx)
    }
    for rnd in not_serving:
        lost.setdefault(rnd, f"round {rnd}: not serving again within the recovery limit")
    return lost


__all__ = ["recovery_verdict"]
