"""Load over several worker processes: merged results, the one schedule kept across workers, a
stop that reaches every worker, and a client that fell behind named and marked. Correctness
only: nothing here asserts a speed (the machine running the tests is small and shared)."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path

import pytest

from vramlab.experiment.kind import ExperimentKind, RunOptions
from vramlab.experiment.plan import parse_plan
from vramlab.load.arrivals import gaps
from vramlab.load.client import OpenAIClient, RequestResult
from vramlab.load.driver import LoadShape, Window, drive
from vramlab.load.prompts import Prompt, cycle
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.load.workers import ClientConfig, WorkerPool, workers_needed
from vramlab.observe.base import Sample, Sampler
from vramlab.run.events import Event, EventHook
from vramlab.run.recorder import StoreRecorder
from vramlab.run.runner import Runner
from vramlab.store import open_store

PROMPTS = [Prompt(f"prompt {i}", 2, 3) for i in range(5)]


def test_one_worker_in_process_until_a_plan_needs_more_than_a_core() -> None:
    assert workers_needed(256, None) == 1 and workers_needed(10, 50.0) == 1
    many = workers_needed(5000, None)
    assert many == min(len(os.sched_getaffinity(0)), 5)


def test_open_loop_over_two_workers_keeps_the_one_schedule_and_merges_every_result() -> None:
    shape = LoadShape("open", 8, 200.0, "poisson", seed=3)
    n = 60
    results: list[RequestResult] = []

    async def go() -> tuple[object, list[int]]:
        async with (
            StubServer(StubBehaviour(ttft_s=0.01, token_s=0.005)) as srv,
            WorkerPool(2, ClientConfig(srv.url, "m", max_connections=16)) as pool,
        ):
            outcome = await pool.drive(
                PROMPTS, shape, Window(duration_s=10, requests=n, drain_s=2), results.append
            )
            return outcome, [r.outcome.sent for r in pool.reports]

    outcome, per_worker = asyncio.run(go())
    ok = [r for r in results if r.ok]
    assert sorted(int(r.request_id[1:]) for r in results) == list(range(n))  # every arrival once, merged
    assert len(ok) == n and outcome.sent == n  # type: ignore[attr-defined]
    assert per_worker == [n // 2, n // 2]  # arrival k went to worker k mod 2
    # The schedule is the single-process one: arrival k at start + the first k gaps of the one
    # sequence, whichever worker sent it (one clock: perf_counter is system-wide).
    by_id = {int(r.request_id[1:]): r.scheduled_at for r in results}
    expected = list(
        itertools.accumulate(itertools.islice(gaps(200.0, "poisson", 1.0, 3), n - 1), initial=0.0)
    )
    for k in range(n):
        assert by_id[k] - by_id[0] == pytest.approx(expected[k], abs=1e-9)
    # and each request's prompt is the one the single-process loop gives arrival k
    seen = {r.request_id: r.prompt_tokens for r in results}
    assert len(seen) == n


def test_closed_loop_users_are_shared_out_and_ids_stay_unique() -> None:
    results: list[RequestResult] = []

    async def go() -> list[int]:
        async with (
            StubServer(StubBehaviour(ttft_s=0.01)) as srv,
            WorkerPool(2, ClientConfig(srv.url, "m", max_connections=8)) as pool,
        ):
            await pool.drive(
                PROMPTS,
                LoadShape("closed", 5),
                Window(requests=40, max_s=20, drain_s=2),
                results.append,
                id_prefix="c",
            )
            return [r.outcome.sent for r in pool.reports]

    per_worker = asyncio.run(go())
    assert per_worker == [20, 20] and len(results) == 40
    assert len({r.request_id for r in results}) == 40 and all(r.ok for r in results)


def test_a_stop_reaches_every_worker_at_once() -> None:
    results: list[RequestResult] = []

    async def go() -> float:
        async with (
            StubServer(StubBehaviour(ttft_s=0.05, token_s=0.05)) as srv,
            WorkerPool(2, ClientConfig(srv.url, "m", max_connections=16)) as pool,
        ):
            stop = asyncio.Event()
            task = asyncio.ensure_future(
                pool.drive(
                    PROMPTS,
                    LoadShape("closed", 6, max_tokens=100),
                    Window(duration_s=30, drain_s=10),
                    results.append,
                    stop=stop,
                )
            )
            await asyncio.sleep(1.0)
            stop.set()
            t = time.perf_counter()
            outcome = await task
            assert outcome.stopped
            return time.perf_counter() - t

    took = asyncio.run(go())
    assert took < 5.0  # not the 30 s window, not the 10 s drain
    cancelled = [r for r in results if r.error_class == "cancelled"]
    assert len(cancelled) == 6  # each user's in-flight request, in both workers, recorded as cancelled


class _Hog(Sampler):
    """A sampler that blocks the runner's event loop: the in-process load client falls behind."""

    source = "host"

    async def sample(self) -> list[Sample]:
        time.sleep(0.12)
        return []


def _plan(url: str, extra: str = "") -> object:
    return parse_plan(f"""
name: workers
target: {{base_url: "{url}", model: m}}
fixed: {{input: {{synthetic: {{prompt_tokens: 4, output_tokens: 4, count: 3}}}}}}
change: {{variable: concurrency, baseline: 2, steps: [4]}}
phases: {{duration_s: 0.8, drain_s: 1}}
rounds: 1
samplers: {{interval_s: 0.2, sources: []}}
{extra}
""")


def _run(tmp_path: Path, options: RunOptions, extra: str = "") -> tuple[object, list[Event], object]:
    store = open_store(str(tmp_path / "w.db"))
    events: list[Event] = []

    async def go() -> object:
        async with StubServer(StubBehaviour(ttft_s=0.01, token_s=0.01)) as srv:
            hook = EventHook()
            hook.add(StoreRecorder(store), critical=True)
            hook.add(events.append)
            options.capture_environment = False
            return await Runner(ExperimentKind(_plan(srv.url, extra), options), hook).run()  # type: ignore[arg-type]

    return asyncio.run(go()), events, store


def test_a_run_over_two_workers_stores_one_merged_run(tmp_path: Path) -> None:
    res, events, store = _run(tmp_path, RunOptions(samplers=[], workers=2))
    assert res.status == "completed"  # type: ignore[attr-defined]
    rows = store.requests(res.run_id)  # type: ignore[attr-defined]
    assert len(rows) == res.requests > 0  # type: ignore[attr-defined]
    assert len({(r.phase, r.request_id, r.attempt) for r in rows}) == len(rows)
    assert {r.phase for r in rows} == {"baseline", "treatment", "recovery"}
    ends = [e for e in events if e.kind == "phase_end"]
    assert all(len(e.data["client_lag"]) == 2 for e in ends)  # both workers report on every window
    assert any("2 worker processes" in n for n in res.notes)  # type: ignore[attr-defined]
    store.close()  # type: ignore[attr-defined]


def test_a_saturated_worker_is_named_and_its_windows_marked(tmp_path: Path) -> None:
    """Every worker's timers wake later than a threshold this small: each is named, by pid, and
    the report's tables mark the windows (the runner's self-check, not the server's latency)."""
    from vramlab.report import load_context, render

    res, events, store = _run(tmp_path, RunOptions(samplers=[], workers=2), "load: {lag_warn_ms: 0.001}")
    warns = [e for e in events if e.kind == "warning" and e.data.get("client_saturated")]
    assert {(e.phase, e.data["worker"]) for e in warns} == {
        (p, w) for p in ("baseline", "treatment", "recovery") for w in (0, 1)
    }
    assert all(f"load worker {e.data['worker']} of 2 (pid {e.data['pid']})" in e.message for e in warns)
    ctx = load_context(store, res.run_id)  # type: ignore[arg-type, attr-defined]
    assert all(
        s.window.client_lag and "load worker 1 of 2" in s.window.client_lag for s in ctx.analysis.steps
    )
    assert "(client lag)" in render(ctx, "md")
    store.close()  # type: ignore[attr-defined]


def test_the_in_process_client_that_falls_behind_is_named_and_only_its_windows_marked(tmp_path: Path) -> None:
    res, events, store = _run(tmp_path, RunOptions(samplers=[_Hog()], workers=1), "load: {lag_warn_ms: 50}")
    ends = {e.phase: e.data for e in events if e.kind == "phase_end"}
    assert all(d["client_saturated"] for d in ends.values())  # a 120 ms block every 200 ms
    assert all(d["client_lag"][0]["loop_lag_max_ms"] > 50 for d in ends.values())
    warns = [e for e in events if e.kind == "warning" and e.data.get("client_saturated")]
    assert warns and all(f"the load client (pid {os.getpid()})" in e.message for e in warns)
    quiet, events2, store2 = _run(
        tmp_path / "q", RunOptions(samplers=[], workers=1), "load: {lag_warn_ms: 50}"
    )
    assert not any(e.data.get("client_saturated") for e in events2 if e.kind == "phase_end")
    store.close()  # type: ignore[attr-defined]
    store2.close()  # type: ignore[attr-defined]


def test_drive_in_process_matches_the_pool_schedule() -> None:
    """The same shape in-process: the same ids and relative scheduled times as over workers."""
    shape = LoadShape("open", 8, 200.0, "poisson", seed=3)
    out: list[RequestResult] = []

    async def go() -> None:
        async with StubServer(StubBehaviour()) as srv, OpenAIClient(srv.url, "m") as c:
            await drive(c, cycle(PROMPTS), shape, Window(duration_s=10, requests=20, drain_s=2), out.append)

    asyncio.run(go())
    expected = list(itertools.accumulate(itertools.islice(gaps(200.0, "poisson", 1.0, 3), 19), initial=0.0))
    got = sorted((int(r.request_id[1:]), r.scheduled_at) for r in out)
    assert [round(t - got[0][1], 9) for _, t in got] == [round(x, 9) for x in expected]


def test_workers_flag_out_of_range_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    plan = tmp_path / "p.yaml"
    plan.write_text("name: x\n")
    proc = subprocess.run(
        [sys.executable, "-m", "vramlab", "run", str(plan), "--workers", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--workers must be between 1 and 256" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_ctrl_c_to_the_process_group_leaves_the_stop_to_the_parent() -> None:
    """Ctrl-C reaches every process of the group; the workers leave it to the parent, which stops
    the window: every in-flight request is still recorded (as cancelled)."""
    import signal

    results: list[RequestResult] = []

    async def go() -> None:
        async with (
            StubServer(StubBehaviour(ttft_s=5.0)) as srv,
            WorkerPool(2, ClientConfig(srv.url, "m", max_connections=8)) as pool,
        ):
            stop = asyncio.Event()
            task = asyncio.ensure_future(
                pool.drive(
                    PROMPTS,
                    LoadShape("closed", 4),
                    Window(duration_s=30, drain_s=5),
                    results.append,
                    stop=stop,
                )
            )
            await asyncio.sleep(1.0)
            for pid in pool.pids:
                os.kill(pid, signal.SIGINT)
            await asyncio.sleep(0.3)
            stop.set()
            outcome = await task
            assert outcome.stopped

    asyncio.run(go())
    assert [r.error_class for r in results] == ["cancelled"] * 4


class _CountingServer:
    """A loopback server in its own thread that answers every request at once with a 500 (the fastest
    failing target there is) and notes when each request arrived (perf_counter: one clock for every
    process on Linux)."""

    def __init__(self) -> None:
        import threading

        self.arrivals: list[float] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> _CountingServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        srv = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        self._ready.set()
        async with srv:
            await self._stop.wait()

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                self.arrivals.append(time.perf_counter())
                n = next(
                    int(x.split(b":")[1])
                    for x in head.split(b"\r\n")
                    if x.lower().startswith(b"content-length")
                )
                await r.readexactly(n)
                w.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\nno")
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_a_fired_stop_stops_every_worker_within_a_handful_of_requests(mode: str) -> None:
    """A stop fired from a result (as the runner's error-rate stop fires) while two workers send as
    fast as a failing server lets them: after it, at most a handful of requests start, in all workers
    together. (Before the stop reached the workers through their event loops only, a worker busy
    sending went on for hundreds of requests.)"""
    from vramlab.load.retry import RetryPolicy
    from vramlab.run.window import Lane, WindowExecutor

    stop_at: list[float] = []
    results: list[RequestResult] = []
    shape = LoadShape("closed", 32) if mode == "closed" else LoadShape("open", 64, 20000.0, "constant")

    async def go(url: str) -> None:
        async with WorkerPool(2, ClientConfig(url, "m", max_connections=64)) as pool:
            ex = WindowExecutor(pool=pool, workers=2)

            def on_result(res: RequestResult) -> None:
                results.append(res)
                if len(results) == 400 and not stop_at:
                    ex.stop()  # what the runner's fire_stop does
                    stop_at.append(time.perf_counter())

            lane = Lane(PROMPTS, shape, Window(duration_s=20, drain_s=5), on_result, "s")
            await asyncio.wait_for(ex.run([lane], RetryPolicy()), 30)

    with _CountingServer() as srv:
        asyncio.run(go(srv.url))
    assert stop_at, "the stop never fired"
    t = stop_at[0]
    started_after = [r for r in results if r.sent_at > t]
    late_arrivals = [a for a in srv.arrivals if a > t + 0.05]  # sent after the stop, whatever the client says
    print(
        f"{mode}: {len(results)} results, {len(started_after)} sent after the stop "
        f"({len(late_arrivals)} arrived 50 ms or more after it)"
    )
    assert len(started_after) <= 8, len(started_after)
    assert len(late_arrivals) <= 8, len(late_arrivals)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_rate_stop_over_workers_sends_nothing_more(tmp_path: Path, workers: int) -> None:
    """The runner's own error-rate stop against a target that fails every request at once: the
    requests the store holds that were sent after the stop's moment are a handful, with one worker
    or two (the parent, busy with thousands of results, must not delay the workers' stop)."""
    store = open_store(str(tmp_path / "w.db"))
    events: list[Event] = []
    plan = """
name: stop
target: {base_url: "URL", model: m}
fixed: {input: {synthetic: {prompt_tokens: 4, output_tokens: 4, count: 3}}}
change: {variable: concurrency, baseline: 32, steps: [32]}
phases: {duration_s: 10, drain_s: 1}
rounds: 1
stop_conditions: {error_rate: 0.5, window_s: 2, min_requests: 2000}
samplers: {interval_s: 0.2, sources: []}
"""

    async def go(url: str) -> object:
        hook = EventHook()
        hook.add(StoreRecorder(store), critical=True)
        hook.add(events.append)
        opts = RunOptions(samplers=[], workers=workers, capture_environment=False)
        return await Runner(ExperimentKind(parse_plan(plan.replace("URL", url)), opts), hook).run()

    with _CountingServer() as srv:
        res = asyncio.run(go(srv.url))
    assert res.status == "stopped", res  # type: ignore[attr-defined]
    t_stop = next(e.t_s for e in events if e.kind == "stop_condition")
    rows = store.requests(res.run_id)  # type: ignore[attr-defined]
    after = [r for r in rows if r.sent_s is not None and r.sent_s > t_stop]
    print(f"{workers} worker(s): {len(rows)} requests, {len(after)} sent after the stop at {t_stop:.3f} s")
    assert len(after) <= 8, len(after)
    store.close()
