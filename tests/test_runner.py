"""The runner end to end against a real loopback server and a real SQLite store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from vramlab.experiment.kind import ExperimentKind, RunOptions
from vramlab.experiment.plan import parse_plan
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.observe.base import FakeSampler
from vramlab.run.events import Event, EventHook
from vramlab.run.recorder import StoreRecorder
from vramlab.run.runner import Runner, RunResult
from vramlab.store import open_store


def _plan(url: str, extra: str = "", steps: str = "[2, 3]", duration: float = 0.25, rounds: int = 2) -> Any:
    return parse_plan(f"""
name: rt
target: {{base_url: "{url}", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 3, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: {steps}}}
phases: {{duration_s: {duration}, drain_s: 0.5}}
rounds: {rounds}
samplers: {{interval_s: 0.05}}
{extra}
""")


class _Breaker:
    """An event subscriber that breaks the stub during treatment at or above a value (the hook runs
    before each window's load starts)."""

    def __init__(self, b: StubBehaviour, fail_from: float) -> None:
        self.b, self.fail_from = b, fail_from
        self.calls: list[tuple[int | None, str | None, int | None, float]] = []

    def __call__(self, ev: Event) -> None:
        if ev.kind != "phase_start":
            return
        value = float(ev.data["value"])
        self.calls.append((ev.round, ev.phase, ev.step, value))
        self.b.fail_status = 500 if ev.phase == "treatment" and value >= self.fail_from else None


def _run(
    tmp_path: Path,
    b: StubBehaviour,
    plan_extra: str = "",
    options: RunOptions | None = None,
    cancel_after: float | None = None,
    on_event: Any = None,
    cancel_after_requests: int | None = None,
    **plan_kw: Any,
) -> tuple[RunResult, Any, list[Event]]:
    store = open_store(str(tmp_path / "v.db"))
    events: list[Event] = []

    async def go() -> RunResult:
        async with StubServer(b) as srv:
            hook = EventHook()
            hook.add(StoreRecorder(store))
            hook.add(events.append)
            if on_event is not None:
                hook.add(on_event)
            opts = options or RunOptions(
                samplers=[
                    FakeSampler("host", {"host.cpu_percent": [10, 20]}),
                    FakeSampler("gpu", {}, unavailable="no NVIDIA driver"),
                ]
            )
            opts.capture_environment = True
            task = asyncio.ensure_future(
                Runner(ExperimentKind(_plan(srv.url, plan_extra, **plan_kw), opts), hook).run()
            )
            if (
                cancel_after_requests is not None
            ):  # Ctrl-C once that many requests came back, however slow the box
                seen = [0]

                def count(ev: Event) -> None:
                    seen[0] += ev.kind == "request"
                    if seen[0] == cancel_after_requests:
                        asyncio.get_running_loop().call_soon(task.cancel)

                hook.add(count)
            if cancel_after is not None:
                await asyncio.sleep(cancel_after)
                task.cancel()
            return await task

    return asyncio.run(go()), store, events


def test_completed_run_stores_every_phase_of_every_round(tmp_path: Path) -> None:
    res, store, events = _run(tmp_path, StubBehaviour(ttft_s=0.005))
    assert res.status == "completed" and res.exit_code == 0 and res.errors == 0
    run = store.get_run(res.run_id)
    assert run.status == "completed" and run.ended_at is not None
    assert "sampler gpu: not used: no NVIDIA driver" in run.notes
    assert any("fewer than 3" in n for n in run.notes)
    assert run.fixed["engine_version"] == "stub-1" and run.fixed["served_models"] == ["stub-model"]
    assert run.change["steps"] == [2, 3] and run.plan["name"] == "rt"
    reqs = store.requests(res.run_id)
    assert len(reqs) == res.requests > 20
    seen = {(r.round, r.phase, r.step, r.step_value) for r in reqs}
    assert seen == {(rd, "baseline", 0, 1.0) for rd in (1, 2)} | {
        (rd, "recovery", 0, 1.0) for rd in (1, 2)
    } | {(rd, "treatment", 1, 2.0) for rd in (1, 2)} | {(rd, "treatment", 2, 3.0) for rd in (1, 2)}
    assert all(r.ok and r.ttft_ms and r.e2e_from_scheduled_ms >= r.e2e_ms for r in reqs)
    kinds = [e.kind for e in store.events(res.run_id)]
    assert kinds.count("phase_start") == kinds.count("phase_end") == 8 and kinds[-1] == "run_end"
    samples = store.samples(res.run_id)
    assert {s.name for s in samples} == {"host.cpu_percent"} and len(samples) >= 10


def test_stop_condition_stops_the_run_and_rollbacks_run(tmp_path: Path) -> None:
    b = StubBehaviour()
    marker = tmp_path / "rolled"
    ctl = _Breaker(b, fail_from=3)
    extra = (
        f"rollback:\n  - 'echo \"$VRAMLAB_RUN_ID $VRAMLAB_RUN_STATUS $VRAMLAB_STOP_REASON\" > {marker}'\n"
        f"  - 'exit 4'\n  - 'echo second >> {marker}'\n"
        "stop_conditions: {error_rate: 0.3, min_requests: 5, window_s: 0.5}"
    )
    res, store, _ = _run(tmp_path, b, extra, RunOptions(samplers=[]), on_event=ctl, duration=1.0)
    assert res.status == "stopped" and res.exit_code == 3
    assert res.stop_reason is not None and res.stop_reason.condition == "error_rate"
    assert ctl.calls[-1][1:] == ("treatment", 2, 3.0)  # stopped in the first bad step
    run = store.get_run(res.run_id)
    assert run.status == "stopped" and "error rate" in (run.stop_reason or "")
    text = marker.read_text().split("\n")
    assert text[0].startswith(f"{res.run_id} stopped error rate") and text[1] == "second"
    rb = [e for e in store.events(res.run_id) if e.kind == "rollback"]
    assert [e.data["exit_code"] for e in rb] == [0, 4, 0]  # a failing rollback does not skip the next
    bad = [r.end_s for r in store.requests(res.run_id) if r.step == 2]
    assert bad and max(bad) - min(bad) < 0.9  # it stopped within the bad window, before its 1 s were up


def test_sample_condition_kv_usage_fires(tmp_path: Path) -> None:
    kv = FakeSampler("engine", {"engine.kv_cache_usage_perc": [0.2, 0.5, 0.99]})
    res, _, events = _run(
        tmp_path,
        StubBehaviour(),
        "stop_conditions: {kv_usage: 0.95}",
        RunOptions(samplers=[kv]),
        duration=1.0,
    )
    assert res.status == "stopped" and res.stop_reason.condition == "kv_usage"  # type: ignore[union-attr]
    assert res.elapsed_s < 3


def test_wall_clock_stops_a_hung_target(tmp_path: Path) -> None:
    res, store, _ = _run(
        tmp_path,
        StubBehaviour(ttft_s=30),
        "stop_conditions: {wall_clock_s: 0.8}",
        RunOptions(samplers=[]),
        duration=5.0,
    )
    assert res.status == "stopped" and res.stop_reason.condition == "wall_clock_s"  # type: ignore[union-attr]
    assert res.elapsed_s < 3
    reqs = store.requests(res.run_id)
    assert reqs and all(r.error_class == "cancelled" for r in reqs)  # in flight when it stopped: recorded


def test_interrupt_marks_the_run_and_keeps_what_was_collected(tmp_path: Path) -> None:
    marker = tmp_path / "rolled"
    res, store, _ = _run(
        tmp_path,
        StubBehaviour(ttft_s=0.01),
        f"rollback: ['echo $VRAMLAB_RUN_STATUS > {marker}']",
        RunOptions(samplers=[]),
        cancel_after_requests=8,
        duration=5.0,
    )
    assert res.status == "interrupted" and res.exit_code == 130
    assert marker.read_text().strip() == "interrupted"
    run = store.get_run(res.run_id)
    assert run.status == "interrupted" and run.ended_at is not None
    assert (
        len(store.requests(res.run_id))
        == res.requests + sum(1 for r in store.requests(res.run_id) if r.error_class == "cancelled")
        > 5
    )


def test_a_broken_subscriber_is_detached_and_noted(tmp_path: Path) -> None:
    def bad(ev: Event) -> None:
        if ev.kind == "phase_end":
            raise RuntimeError("display broke")

    hook_events: list[str] = []

    async def go() -> RunResult:
        async with StubServer(StubBehaviour()) as srv:
            hook = EventHook()
            hook.add(bad)
            hook.add(lambda e: hook_events.append(e.kind))
            return await Runner(
                ExperimentKind(
                    _plan(srv.url, rounds=1, steps="[2]"), RunOptions(samplers=[], capture_environment=False)
                ),
                hook,
            ).run()

    res = asyncio.run(go())
    assert res.status == "completed"
    assert any("display broke" in n for n in res.notes)
    assert hook_events.count("phase_end") == 3


@pytest.mark.parametrize(
    "variable,steps,field", [("output_tokens", "[5]", "max_tokens"), ("prompt_tokens", "[40]", "messages")]
)
def test_token_variables_change_the_requests(tmp_path: Path, variable: str, steps: str, field: str) -> None:
    b = StubBehaviour()

    async def go() -> RunResult:
        async with StubServer(b) as srv:
            plan = _plan(srv.url, rounds=1, steps=steps).model_copy(deep=True)
            text = plan.model_dump(mode="json")
            text["change"] = {"variable": variable, "steps": [float(steps.strip("[]"))]}
            from vramlab.experiment.plan import Plan

            return await Runner(
                ExperimentKind(Plan.model_validate(text), RunOptions(samplers=[], capture_environment=False)),
                EventHook(),
            ).run()

    asyncio.run(go())
    if field == "max_tokens":
        assert {body["max_tokens"] for body in b.seen} == {3, 5}
    else:
        lengths = {len(body["messages"][0]["content"].split()) for body in b.seen}
        assert lengths == {6, 38}  # prompt_tokens - 3 words + the "#seed-i:" tag
