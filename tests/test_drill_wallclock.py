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


def test_a_stream_ramp_stops_at_what_the_client_holds_and_says_so() -> None:
    import pytest

    from vramlab.drill.ramp import MAX_STREAMS, RampSpec, ramp_values

    huge = RampSpec(knob="concurrency", start=2.0, ceiling=1e9)
    assert ramp_values(huge)[-1] == MAX_STREAMS and len(ramp_values(huge)) == 11
    assert "stops at 2,048" in (huge.capped_note() or "")
    assert RampSpec(knob="batch", start=2.0, ceiling=64.0).capped_note() is None
    assert ramp_values(RampSpec(knob="context", start=256.0, ceiling=1e6))[-1] == 1e6  # tokens: no cap
    with pytest.raises(ValueError, match="streams one load client holds"):
        RampSpec(knob="concurrency", start=1e6, ceiling=1e9)


def test_a_huge_ceiling_ramp_ends_on_its_wall_clock(tmp_path):
    """A ceiling of 1e9 once ramped to 65,536 streams, fired its 30 s wall clock at 40 s and was still
    running at 60 s: the ramp stops at MAX_STREAMS and the drill ends within its wall clock and slack."""
    import time

    store = open_store(str(tmp_path / "s.db"))

    async def go():
        async with StubServer(StubBehaviour(ttft_s=0.01)) as srv:
            doc = {
                "name": "huge-ceiling",
                "rounds": 1,
                "baseline_s": 0.3,
                "target": {"kind": "command", "environment": "test", "base_url": srv.url, "model": "m"},
                "load": {"concurrency": 2, "prompt_tokens": 8, "max_tokens": 2},
                "ramp": {"knob": "concurrency", "start": 512, "factor": 4, "ceiling": 1e9, "step_s": 1.0},
                "stop": {"wall_clock_s": 3.0},
            }
            r = DrillKind(parse_plan(doc), store, workdir=str(tmp_path / "w"))
            t = time.monotonic()
            res = await asyncio.wait_for(run_drill_kind(r, store), 120)
            return r.run_id, res, time.monotonic() - t

    rid, res, took = asyncio.run(go())
    steps = [float(e.data["value"]) for e in store.events(rid) if e.kind == "step"]
    assert max(steps) <= 2048, steps
    assert any("stops at 2,048" in n for n in store.get_run(rid).notes)
    assert took < 3.0 + 25, took  # the wall clock, the cancellation of what was in flight, a busy machine
