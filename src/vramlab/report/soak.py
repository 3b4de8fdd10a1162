"""The "Soak" section: a `change.soak` run's verdict (memory growth per hour, latency and error
drift against the first window, restarts seen) and its windows side by side."""

from __future__ import annotations

import dataclasses
from typing import Any

from vramlab.report import fmt
from vramlab.report.blocks import Block, Table, Text
from vramlab.report.sections import ReportContext, Section


def s_soak(ctx: ReportContext) -> list[Block]:
    out: list[Block] = []
    for r in ctx.analysis.soak:
        growth = "–" if r.memory_growth_gib_per_h is None else f"{r.memory_growth_gib_per_h:+.3f} GiB/h"
        drift = "–" if r.latency_drift is None else f"{r.latency_drift:+.0%}"
        head = (
            f"Verdict: {r.verdict}"
            + (f" ({'; '.join(r.reasons)})" if r.reasons else "")
            + f". Memory growth {growth} ({r.memory_source or 'no memory samples'}), P95 e2e drift {drift}, "
            f"error drift {r.error_drift:+.1%}, restarts {r.restarts}; {len(r.windows)} windows of {r.window_s:g} s."
        )
        rows = [
            [
                f"{w.start_s:.0f}–{w.end_s:.0f}",
                str(w.requests),
                fmt.pct(w.error_rate),
                fmt.ms(w.p95_e2e_ms),
                fmt.ms(w.p95_ttft_ms),
                fmt.gib(w.memory_bytes),
            ]
            for w in r.windows
        ]
        out += [
            Text(head),
            Table(["window (s)", "requests", "errors", "P95 e2e ms", "P95 TTFT ms", "memory GiB"], rows),
        ]
    return out


def soak_json(ctx: ReportContext) -> Any:
    return [dataclasses.asdict(r) for r in ctx.analysis.soak]


SECTIONS = (
    Section(
        "soak",
        "Soak: drift over the long window",
        s_soak,
        order=13,
        applies=lambda ctx: bool(ctx.analysis.soak),
        data=soak_json,
    ),
)

__all__ = ["SECTIONS", "s_soak", "soak_json"]
