"""A drill whose own time runs out is stopped, not failed: no fault, no recovery, no ceiling claim."""

from __future__ import annotations

import asyncio

from vramlab.drill.kind import DrillKind
from vramlab.drill.plan import parse_plan
from vramlab.drill.start import run_drill_kind
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.store import open_store


def test_wall_clock_stops_the_drill_without_blaming_the_target(tmp_path):
    from vramlab.report import load_context, render
    from vramlab.report.incident import summary_line

    store = open_store(str(tmp_path / "s.db"))

    async def go():
        async with StubServer(StubBehaviour(ttft_s=0.01)) as srv:
            doc = {
                "name": "clock",
                "rounds": 1,
                "baseline_s": 0.5,
                "target": {"kind": "command", "environment": "test", "base_url": srv.url, "model": "m"},
                "load": {"concurrency": 2, "prompt_tokens": 8, "max_tokens": 2},
                "ramp": {"knob": "concurrency", "start": 2, "factor": 2, "ceiling": 64, "step_s": 1.0},
                "stop": {"wall_clock_s": 2.0},
            }
            r = DrillKind(parse_plan(doc), store, workdir=str(tmp_path / "w"))
            res = await asyncio.wait_for(run_drill_kind(r, store), 30)
            return r.run_id, res

    rid, res = asyncio.run(go())
    kinds = [e.kind for e in store.events(rid)]
    assert res.status == "stopped" and res.failed_rounds == [] and res.unrecovered_rounds == []
    assert "fault" not in kinds and "mitigation" not in kinds and "ceiling" not in kinds
    assert "stopped" in kinds and "stop_condition" in kinds
    ctx = load_context(store, rid)
    line = summary_line(ctx)
    assert line.startswith("stopped by the wall clock during concurrency =") and "nothing had failed" in line
    md = render(ctx, "md")
    assert "no OOM up to 64" not in md and "no boundary found" in md
