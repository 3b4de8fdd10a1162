"""A drill plan's `load.think_time_s`: each closed-loop user pauses that long after a successful
request (load/driver.py's smallest hook, `LoadShape.think_s`)."""

from __future__ import annotations

import asyncio
import time

from vramlab.load.client import RequestResult
from vramlab.load.driver import LoadShape, Window, drive
from vramlab.load.prompts import cycle, synthetic_prompts


class _Instant:
    async def send(self, request_id, prompt, max_tokens, scheduled_at, attempt=0):
        now = time.perf_counter()
        return RequestResult(
            request_id=request_id,
            attempt=attempt,
            scheduled_at=scheduled_at,
            sent_at=now,
            end_at=now,
            first_token_at=now,
            status_code=200,
            output_tokens=1,
        )


def _count(think_s: float) -> int:
    got: list[RequestResult] = []
    prompts = cycle(synthetic_prompts(8, 2, 4, seed=1))
    asyncio.run(
        drive(
            _Instant(),
            prompts,
            LoadShape(mode="closed", concurrency=2, think_s=think_s),
            Window(duration_s=1.0, drain_s=0.1),
            got.append,
        )
    )
    return len(got)


def test_think_time_paces_each_user_and_zero_does_not():
    paced = _count(0.25)
    assert 2 <= paced <= 2 * 5, paced  # two users, one request per 0.25 s each, in 1 s
    assert _count(0.0) > 5 * paced  # without it a user resubmits at once


def test_the_drill_paces_its_users_by_think_time(tmp_path):
    from vramlab.drill.kind import DrillKind
    from vramlab.drill.plan import parse_plan
    from vramlab.drill.start import run_drill_kind
    from vramlab.load.stub import StubBehaviour, StubServer
    from vramlab.store import open_store

    def baseline_requests(think: float) -> int:
        store = open_store(str(tmp_path / f"s{think}.db"))

        async def go():
            async with StubServer(StubBehaviour()) as srv:
                doc = {
                    "name": "think",
                    "rounds": 1,
                    "baseline_s": 1.0,
                    "target": {"kind": "command", "environment": "test", "base_url": srv.url, "model": "m"},
                    "load": {"concurrency": 2, "prompt_tokens": 8, "max_tokens": 2, "think_time_s": think},
                    "ramp": {"knob": "concurrency", "start": 2, "ceiling": 2, "step_s": 0.3},
                    "stop": {"wall_clock_s": 30},
                }
                r = DrillKind(parse_plan(doc), store, workdir=str(tmp_path / f"w{think}"))
                await asyncio.wait_for(run_drill_kind(r, store), 30)
                return r.run_id

        rid = asyncio.run(go())
        return sum(1 for q in store.requests(rid) if q.phase == "baseline" and q.error_class != "cancelled")

    paced = baseline_requests(0.25)
    assert 2 <= paced <= 2 * 5, paced
    assert baseline_requests(0.0) > 2 * paced
