"""Runner parts on their own: stop conditions, step strategies, rollbacks, the store writer,
the client-fell-behind warning, and the store on PostgreSQL when one is there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from _narrow import some
from vramlab.experiment.kind import ExperimentKind, RunOptions
from vramlab.experiment.plan import parse_plan
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.plandoc import RollbackCommand, StopConditions
from vramlab.records import RequestRecord, RunRecord
from vramlab.records.memory import MemoryStore
from vramlab.run.events import Event, EventHook
from vramlab.run.recorder import StoreRecorder
from vramlab.run.rollback import run_rollbacks
from vramlab.run.runner import Runner
from vramlab.run.steps import FixedSteps, StepOutcome
from vramlab.run.stop import StopMonitor
from vramlab.store import open_store


def test_error_rate_needs_min_requests_and_slides() -> None:
    m = StopMonitor(StopConditions(error_rate=0.5, min_requests=4, window_s=10), wall_clock_s=1000)
    for t in range(3):
        m.on_request(t, False, "http_5xx", None)
    assert m.check(3) is None  # three failures are not yet enough to judge
    m.on_request(3, False, "http_5xx", None)
    r = m.check(4)
    assert r is not None and r.condition == "error_rate" and r.value == 1.0 and "4/4" in r.message
    assert m.check(30) is None  # the failures left the window


def test_cancelled_requests_are_not_errors_and_p95_uses_the_schedule() -> None:
    m = StopMonitor(StopConditions(error_rate=0.1, p95_ms=500, min_requests=5), wall_clock_s=1000)
    for i in range(20):
        m.on_request(i * 0.1, False, "cancelled", None)
    assert m.check(2) is None
    for i in range(20):
        m.on_request(2 + i * 0.01, True, None, 100 if i < 19 else 900)
    assert m.check(3) is None  # P95 of 19 x 100 ms and one 900 ms is 140 ms: one slow request is a tail
    m.on_request(3.1, True, None, 950)
    m.on_request(3.1, True, None, 950)
    assert m.check(3.2) is None  # the P95 is re-sorted at most every 0.5 s
    r = m.check(3.6)
    assert (
        r is not None and r.condition == "p95_ms" and r.value == pytest.approx(947.5)
    )  # the report's P95 too


def test_samples_oom_and_wall_clock() -> None:
    m = StopMonitor(StopConditions(kv_usage=0.95, gpu_memory_share=0.9), wall_clock_s=60)
    m.on_sample("engine.kv_cache_usage_perc", 0.5)
    m.on_sample("gpu.memory_share", 0.5, "gpu:0")
    m.on_sample("gpu.memory_share", 0.93, "gpu:1")
    r = m.check(1)
    assert r is not None and r.condition == "gpu_memory_share" and r.value == 0.93
    m.on_sample("gpu.memory_share", 0.1, "gpu:1")
    m.on_sample("engine.kv_cache_usage_perc", 0.96)
    assert m.check(1).condition == "kv_usage"  # type: ignore[union-attr]
    m2 = StopMonitor(StopConditions(), wall_clock_s=60)
    m2.on_request(1, False, "oom", None, "CUDA out of memory. Tried to allocate 2 GiB")
    assert m2.check(2).condition == "oom_seen" and "Tried to allocate" in m2.check(2).message  # type: ignore[union-attr]
    assert m2.check(60).condition == "wall_clock_s"  # type: ignore[union-attr]
    m3 = StopMonitor(StopConditions(oom_seen=False), wall_clock_s=60)
    m3.on_oom("engine log: CUDA out of memory")
    assert m3.check(1) is None


def test_step_strategies() -> None:
    f = FixedSteps([2, 4, 8])
    out = lambda i, v, stop=None: StepOutcome(i, v, 10, 0, 1.0, stop)  # noqa: E731
    assert f.first() == 2 and f.next(out(1, 2)) == 4 and f.next(out(3, 8)) is None


def test_rollback_timeout_kills_the_group(tmp_path: Path) -> None:
    marker = tmp_path / "late"
    cmds = [RollbackCommand(run=f"sleep 5 && touch {marker}", timeout_s=0.3), RollbackCommand(run="echo $X")]
    t = time.monotonic()
    res = asyncio.run(run_rollbacks(cmds, {"X": "next-one-ran"}))
    assert time.monotonic() - t < 3
    assert res[0].exit_code is None and not res[0].ok
    assert res[1].ok and res[1].output_tail == "next-one-ran"
    time.sleep(0.2)
    assert not marker.exists()


def _records(n: int, run_id: str) -> list[RequestRecord]:
    return [
        RequestRecord(
            run_id=run_id,
            round=1,
            phase="baseline",
            request_id=f"r{i}",
            status_code=200,
            sent_s=i * 0.01,
            end_s=i * 0.01 + 0.005,
        )
        for i in range(n)
    ]


def test_recorder_writes_in_batches_and_keeps_notes(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "v.db"))
    rec = StoreRecorder(store, flush_s=3600, batch=50)
    rec(Event("run_start", 0, payload=RunRecord(run_id="0123abcd", name="x", started_at=time.time())))
    # A batch counts every pending row: the run_start event and 48 requests are 49, not yet a batch.
    for r in _records(48, "0123abcd"):
        rec(Event("request", r.end_s or 0, payload=r))
    assert store.requests("0123abcd") == []  # not yet a batch
    rec(Event("request", 1, payload=_records(49, "0123abcd")[-1]))
    assert rec.wait_idle()  # the writer thread took the batch
    assert len(store.requests("0123abcd")) == 49
    rec(Event("note", 1.1, message="sampler gpu: not used: no NVIDIA driver"))
    assert rec.wait_idle()
    assert store.get_run("0123abcd").notes == ["sampler gpu: not used: no NVIDIA driver"]
    rec(Event("run_end", 2, data={"status": "stopped", "ended_at": time.time(), "stop_reason": "kv"}))
    run = store.get_run("0123abcd")
    assert (run.status, run.stop_reason) == ("stopped", "kv")
    assert [e.kind for e in store.events("0123abcd")] == ["run_start", "note", "run_end"]
    store.close()


def test_client_falling_behind_gives_a_warning(tmp_path: Path) -> None:
    """An open loop at 50/s into one slot on a 50 ms server: requests wait for the slot."""

    async def go() -> list[Event]:
        events: list[Event] = []
        async with StubServer(StubBehaviour(ttft_s=0.05)) as srv:
            plan = parse_plan(f"""
name: lag
target: {{base_url: "{srv.url}", model: m}}
fixed: {{input: {{synthetic: {{prompt_tokens: 4, output_tokens: 1, count: 2}}}}}}
change: {{variable: request_rate, steps: [50]}}
phases: {{duration_s: 0.5, drain_s: 0.2}}
rounds: 1
load: {{mode: open, request_rate: 2, max_concurrency: 1, lag_warn_ms: 20}}
""")
            hook = EventHook()
            hook.add(events.append)
            res = await Runner(
                ExperimentKind(plan, RunOptions(samplers=[], capture_environment=False)), hook
            ).run()
            assert res.status == "completed"
        return events

    events = asyncio.run(go())
    warns = [e for e in events if e.kind == "warning"]
    assert len(warns) == 1 and warns[0].phase == "treatment" and "fell behind" in warns[0].message
    reqs = [
        p
        for e in events
        if e.kind == "request"
        and e.phase == "treatment"
        and isinstance(p := e.payload, RequestRecord)
        and p.ok
    ]
    assert max(some(r.e2e_from_scheduled_ms) - some(r.e2e_ms) for r in reqs) > 100


@pytest.fixture()
def pg_url() -> str:
    from _store_backends import pg_url_or_skip  # one skip/fail rule for every PostgreSQL test

    return pg_url_or_skip()


@pytest.mark.postgres
def test_a_run_is_stored_in_postgresql(pg_url: str) -> None:
    import threading

    from vramlab.experiment.start import run_plan

    box: dict[str, object] = {}
    ready, done = threading.Event(), threading.Event()

    def serve() -> None:
        async def main() -> None:
            async with StubServer(StubBehaviour()) as srv:
                box["url"] = srv.url
                ready.set()
                while not done.is_set():
                    await asyncio.sleep(0.05)

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    try:
        plan = parse_plan(f"""
name: pg
target: {{base_url: "{box["url"]}", model: m}}
fixed: {{input: {{synthetic: {{prompt_tokens: 4, output_tokens: 2, count: 2}}}}}}
change: {{variable: concurrency, steps: [2]}}
phases: {{duration_s: 0.3}}
rounds: 1
samplers: {{sources: [host]}}
""")
        out = run_plan(plan, plan_dir=Path("."), open_store=lambda: open_store(pg_url))
    finally:
        done.set()
        t.join(5)
    assert out.result.status == "completed"
    with open_store(pg_url) as store:
        assert store.get_run(out.result.run_id).status == "completed"
        assert len(store.requests(out.result.run_id)) == out.result.requests > 3
        assert store.samples(out.result.run_id)


class _FlakyStore(MemoryStore):
    """A store whose writes fail twice, then work: rows wait for the next flush."""

    fails = 2

    def add_requests(self, run_id: str, records: Sequence[RequestRecord]) -> int:
        if self.fails:
            self.fails -= 1
            raise OSError("database is locked")
        return super().add_requests(run_id, records)


def test_recorder_keeps_rows_when_the_store_fails() -> None:
    real = _FlakyStore()
    rec = StoreRecorder(real, flush_s=3600, batch=10, retry_base_s=0.01)
    rec(Event("run_start", 0, payload=RunRecord(run_id="0123abce", name="x", started_at=time.time())))
    for r in _records(25, "0123abce"):
        rec(Event("request", r.end_s or 0, payload=r))
    assert rec.wait_idle()
    assert rec.store_errors == ["OSError: database is locked"] * 2 and rec.failure is None
    rec(Event("run_end", 2, data={"status": "completed", "ended_at": time.time()}))
    run = real.get_run("0123abce")
    assert len(real.requests("0123abce")) == 25 and run.status == "completed"
    assert run.notes == ["store: 2 writes failed and were retried; first: OSError: database is locked"]
    real.close()


def test_unreachable_target_is_noted_and_stopped_by_error_rate(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening
        plan = parse_plan(f"""
name: down
target: {{base_url: "{url}", model: m}}
fixed: {{input: {{synthetic: {{prompt_tokens: 4, output_tokens: 1, count: 2}}}}}}
change: {{variable: concurrency, steps: [2]}}
phases: {{duration_s: 5}}
stop_conditions: {{min_requests: 5}}
load: {{retry: {{base_s: 0.05, max_s: 0.1}}}}
""")  # the users' back-off after a refused connection is the plan's: short here, so 5 failures come fast
        res = asyncio.run(Runner(ExperimentKind(plan, RunOptions(samplers=[])), EventHook()).run())
    assert res.status == "stopped" and res.stop_reason.condition == "error_rate"  # type: ignore[union-attr]
    assert res.elapsed_s < 4
    assert res.requests <= 5 + 2  # stopped at once: no more than the users had in hand
    assert any(n.startswith("target not reachable at") for n in res.notes)


def test_progress_lines_plain_and_rich() -> None:
    import io

    from vramlab.experiment.progress import PlainProgress, RichProgress, make_progress

    buf = io.StringIO()
    p = make_progress(buf)
    assert isinstance(p, PlainProgress)
    rec = _records(1, "0123abcd")[0]
    for ev in [
        Event("run_start", 0, message="run x"),
        Event("phase_start", 0.1, 1, "baseline", 0, "round 1/3 baseline"),
        Event("request", 0.2, payload=rec),
        Event("phase_end", 1, 1, "baseline", 0, "round 1/3 baseline: 1 requests"),
        Event("stop_condition", 1.5, message="error rate 90%"),
        Event("run_end", 2, message="run x stopped"),
    ]:
        p(ev)
    lines = buf.getvalue().splitlines()
    assert lines == [
        "[    0.0s] run x",
        "[    1.0s] round 1/3 baseline: 1 requests",
        "[    1.5s] STOP : error rate 90%",
        "[    2.0s] run x stopped",
    ]
    buf = io.StringIO()
    r = RichProgress(buf)
    r(Event("phase_start", 0.1, message="round 1/3 baseline"))
    r(Event("request", 0.2, payload=rec))
    r(Event("run_end", 2, message="run x completed"))
    assert "run x completed" in buf.getvalue()


def test_environment_facts_from_a_fake_nvml() -> None:
    from types import SimpleNamespace

    from vramlab.experiment.environment import gpu_facts, host_facts

    fake = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda h, version=None: SimpleNamespace(
            total=141 * 2**30, used=0, free=141 * 2**30
        ),
    )
    assert gpu_facts(fake) == {
        "gpu_count": 2,
        "driver": "550.54.15",
        "gpu_name": "NVIDIA H200",
        "gpu_memory_bytes": 141 * 2**30,
    }
    assert host_facts()["vramlab_version"]


def test_a_store_that_refuses_the_run_stops_it_before_any_load(tmp_path: Path) -> None:
    from vramlab.errors import VramlabError

    class _NoStore(MemoryStore):
        def create_run(self, run: RunRecord) -> RunRecord:
            raise VramlabError("cannot open the store: disk full")

    b = StubBehaviour()

    async def go() -> None:
        async with StubServer(b) as srv:
            hook = EventHook()
            hook.add(StoreRecorder(_NoStore()), critical=True)
            hook.add(lambda e: None)
            plan = parse_plan(f"""
name: x
target: {{base_url: "{srv.url}", model: m}}
fixed: {{input: {{synthetic: {{prompt_tokens: 4, output_tokens: 1, count: 2}}}}}}
change: {{variable: concurrency, steps: [2]}}
phases: {{duration_s: 1}}
""")
            await Runner(ExperimentKind(plan, RunOptions(samplers=[], capture_environment=False)), hook).run()

    with pytest.raises(VramlabError, match="disk full"):
        asyncio.run(go())
    assert b.seen == []  # not one request was sent
