"""Samplers: fakes for the loop, a fake NVML, the sim's real ledger file, real /metrics
expositions (prometheus_client) for every engine's spelling, host and health on loopback."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.observe.base import FakeSampler, Sample, Sampler, SamplerSet
from vramlab.observe.health import HealthSampler
from vramlab.observe.host import HostSampler
from vramlab.observe.ledger import LedgerSampler
from vramlab.observe.nvml import GpuSampler, NvmlDevices
from vramlab.observe.prom_api import PromApiSampler, parse_query_result
from vramlab.observe.prom_text import PromTextSampler, parse_metrics

GiB = 2**30


def _exposition(
    gauges: dict[str, float], counters: dict[str, float] | None = None, labels: list[str] | None = None
) -> str:
    reg = CollectorRegistry()
    for name, v in gauges.items():
        g = Gauge(name, "x", ["model_name"], registry=reg)
        for lab in labels or ["m"]:
            g.labels(lab).set(v)
    for name, v in (counters or {}).items():
        Counter(name, "x", registry=reg).inc(v)
    return generate_latest(reg).decode()


def _by_name(samples: list[Sample]) -> dict[str, float]:
    return {s.name: s.value for s in samples}


@pytest.mark.parametrize(
    "text,kv,running,waiting",
    [
        (
            _exposition(
                {
                    "vllm:kv_cache_usage_perc": 0.42,
                    "vllm:num_requests_running": 3,
                    "vllm:num_requests_waiting": 7,
                },
                {"vllm:num_preemptions": 2},
            ),
            0.42,
            3,
            7,
        ),
        (
            _exposition(
                {
                    "vllm:gpu_cache_usage_perc": 0.9,
                    "vllm:num_requests_running": 1,
                    "vllm:num_requests_waiting": 0,
                }
            ),
            0.9,
            1,
            0,
        ),  # vLLM before the rename
        (
            _exposition(
                {"sglang:token_usage": 0.5, "sglang:num_running_reqs": 4, "sglang:num_queue_reqs": 2}
            ),
            0.5,
            4,
            2,
        ),
        (_exposition({"tgi_batch_current_size": 6, "tgi_queue_size": 9}), None, 6, 9),
        (
            _exposition(
                {
                    "llamacpp:kv_cache_usage_ratio": 0.25,
                    "llamacpp:requests_processing": 2,
                    "llamacpp:requests_deferred": 1,
                }
            ),
            0.25,
            2,
            1,
        ),
    ],
)
def test_engine_metric_aliases(text: str, kv: float | None, running: float, waiting: float) -> None:
    got = _by_name(parse_metrics(text))
    assert got.get("engine.kv_cache_usage_perc") == kv
    assert got["engine.num_requests_running"] == running and got["engine.num_requests_waiting"] == waiting


def test_counters_with_total_and_label_sets_combine() -> None:
    text = _exposition(
        {"vllm:kv_cache_usage_perc": 0.3, "vllm:num_requests_running": 2},
        {"vllm:num_preemptions": 5},
        labels=["a", "b"],
    )
    got = _by_name(parse_metrics(text))
    assert got["engine.num_preemptions_total"] == 5  # exposed as vllm:num_preemptions_total
    assert got["engine.num_requests_running"] == 4  # summed over models
    assert got["engine.kv_cache_usage_perc"] == 0.3  # a fraction: the max, not a sum
    # the new spelling wins when an engine exposes both during the deprecation window
    both = _exposition({"vllm:kv_cache_usage_perc": 0.1, "vllm:gpu_cache_usage_perc": 0.8})
    assert _by_name(parse_metrics(both))["engine.kv_cache_usage_perc"] == 0.1


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_parser_never_crashes_on_junk(text: str) -> None:
    try:
        parse_metrics(text)
    except ValueError:
        pass


def test_prom_text_sampler_against_a_real_endpoint() -> None:
    b = StubBehaviour(metrics_text=_exposition({"vllm:kv_cache_usage_perc": 0.7}))

    async def go() -> tuple[list[Sample], str]:
        async with StubServer(b) as srv:
            s = PromTextSampler(srv.url + "/metrics")
            await s.open()
            try:
                return await s.sample(), srv.url
            finally:
                await s.close()

    samples, _ = asyncio.run(go())
    assert _by_name(samples) == {"engine.kv_cache_usage_perc": 0.7}
    assert samples[0].source == "engine" and samples[0].labels == {"metric": "vllm:kv_cache_usage_perc"}


class _Mem(SimpleNamespace):
    pass


def _fake_nvml(used: int = 10 * GiB, fail_init: bool = False) -> Any:
    def init() -> None:
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def wait(_es: object, _timeout: int) -> object:
        if state["xids"]:
            return SimpleNamespace(device="h0", eventData=state["xids"].pop(0))
        raise RuntimeError("timeout")

    state: dict[str, Any] = {"xids": [79]}
    return SimpleNamespace(
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlSystemGetDriverVersion=lambda: "550.54",
        nvmlMemory_v2=0x02000028,
        nvmlDeviceGetMemoryInfo=lambda h, version=None: _Mem(
            total=80 * GiB, used=used, free=80 * GiB - used, reserved=GiB // 2
        ),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            SimpleNamespace(pid=123, usedGpuMemory=8 * GiB),
            SimpleNamespace(pid=124, usedGpuMemory=2**64 - 1),
        ],
        nvmlEventSetCreate=lambda: "es",
        nvmlEventTypeXidCriticalError=8,
        nvmlDeviceRegisterEvents=lambda h, t, es: None,
        nvmlEventSetWait_v2=wait,
        nvmlDeviceGetIndex=lambda h: 0,
    )


def test_gpu_sampler_on_a_fake_nvml() -> None:
    s = GpuSampler(nvml=_fake_nvml())
    asyncio.run(s.open())
    out = asyncio.run(s.sample())
    got = {(x.name, x.labels.get("pid")): x.value for x in out}
    assert got[("gpu.memory_used_bytes", None)] == 10 * GiB
    assert got[("gpu.memory_share", None)] == pytest.approx(0.125)
    assert got[("gpu.memory_reserved_bytes", None)] == GiB // 2
    assert got[("gpu.utilization_perc", None)] == 87
    assert got[("gpu.process_memory_bytes", "123")] == 8 * GiB
    assert got[("gpu.process_memory_bytes", "124")] == 0  # "not available" is not 16 EiB
    assert got[("gpu.xid", None)] == 79


def test_no_driver_is_a_note_not_a_failure() -> None:
    notes: list[str] = []
    got: list[Sample] = []

    async def go() -> list[str]:
        ss = SamplerSet(
            [GpuSampler(nvml=_fake_nvml(fail_init=True)), FakeSampler("host", {"host.cpu_percent": [5]})],
            0.05,
            got.extend,
            notes.append,
        )
        await ss.start()
        await asyncio.sleep(0.12)
        await ss.stop()
        return ss.active

    assert asyncio.run(go()) == ["host"]
    assert notes == ["sampler gpu: not used: no NVIDIA driver (NVML Shared Library Not Found)"]
    assert got and all(s.name == "host.cpu_percent" for s in got)
    assert NvmlDevices(_fake_nvml()).driver_version() == "550.54"


class _Flaky(Sampler):
    source = "engine"

    async def sample(self) -> list[Sample]:
        raise ConnectionError("scrape failed")


def test_a_failing_sampler_is_noted_once_and_others_go_on() -> None:
    notes: list[str] = []
    got: list[Sample] = []
    fake = FakeSampler("host", {"host.cpu_percent": [1, 2, 3]})

    async def go() -> None:
        ss = SamplerSet([_Flaky(), fake], 0.02, got.extend, notes.append)
        await ss.start()
        await asyncio.sleep(0.15)
        await ss.stop()

    asyncio.run(go())
    assert notes == ["sampler engine: failing: ConnectionError: scrape failed"]
    assert [s.value for s in got][:3] == [1, 2, 3] and fake.closed


def test_ledger_sampler_reads_the_sims_card(tmp_path: Path) -> None:
    from vramlab.sim.ledger import DeviceLedger

    path = tmp_path / "gpu0.ledger"
    missing = LedgerSampler(path)
    with pytest.raises(Exception, match="no device ledger"):
        asyncio.run(missing.open())
    dev = DeviceLedger(path, gpu="h100-80gb")
    dev.allocate(20 * GiB, kind="balloon", name="balloon")
    s = LedgerSampler(path)
    asyncio.run(s.open())
    got = {x.name: x for x in asyncio.run(s.sample())}
    assert got["gpu.memory_used_bytes"].value == 20 * GiB and got["gpu.memory_used_bytes"].source == "ledger"
    assert got["gpu.memory_share"].value == pytest.approx(20 * GiB / dev.total_bytes)
    assert got["gpu.process_memory_bytes"].labels["pid"] == str(os.getpid())


def test_host_sampler_reads_the_target_rss() -> None:
    s = HostSampler(os.getpid())
    asyncio.run(s.open())
    got = _by_name(asyncio.run(s.sample()))
    assert got["host.target_rss_bytes"] > 10 * 2**20
    assert got["host.ram_total_bytes"] >= got["host.ram_used_bytes"] > 0
    assert 0 <= got["host.cpu_percent"] <= 100 * (os.cpu_count() or 1)


def test_host_sampler_counts_the_targets_children_and_follows_a_restart() -> None:
    import subprocess
    import sys

    # a shell that does not exec: the engine is its child, and the shell alone holds ~1 MiB
    hold = "bytearray(40 << 20); import time; time.sleep(30)"
    procs = [subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c 'x = {hold}'; true"]) for _ in range(2)]
    try:
        current = [procs[0].pid]
        s = HostSampler(pid_of=lambda: current[0])
        asyncio.run(s.open())
        deadline = time.monotonic() + 20
        while True:
            smp = next(x for x in s.read() if x.name == "host.target_rss_bytes")
            if smp.value > 40 << 20 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert smp.value > 40 << 20 and smp.labels == {"pid": str(procs[0].pid), "processes": "2"}
        # each process of the tree on its own too, named as the kernel shows it (vLLM's "VLLM::Worker")
        each = [x for x in s.read() if x.name == "host.process_rss_bytes"]
        assert len(each) == 2 and each[0].labels == {"pid": str(procs[0].pid), "name": "sh"}
        assert each[1].labels["name"].startswith("python") and each[1].value > 40 << 20
        current[0] = procs[1].pid  # the drill restarted the target: a new pid
        smp = next(x for x in s.read() if x.name == "host.target_rss_bytes")
        assert smp.labels["pid"] == str(procs[1].pid)
    finally:
        import psutil

        for p in procs:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait(5)


def test_host_sampler_sums_the_target_process_tree() -> None:
    # vLLM's CPU build serves from three processes: the target's RSS is its tree's, not the leader's alone
    import subprocess
    import sys

    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; b = bytearray(64 << 20); "
            "c = subprocess.Popen([sys.executable, '-c', 'b = bytearray(96 << 20); import time; time.sleep(30)']); "
            "time.sleep(30)",
        ]
    )
    try:
        import psutil

        proc = psutil.Process(leader.pid)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            proc.children() and proc.children()[0].memory_info().rss > 96 << 20
        ):
            time.sleep(0.1)
        s = HostSampler(leader.pid)
        asyncio.run(s.open())
        sample = next(x for x in asyncio.run(s.sample()) if x.name == "host.target_rss_bytes")
        alone = proc.memory_info().rss
        assert sample.labels["processes"] == "2"
        assert sample.value >= alone + (96 << 20), (sample.value, alone)
    finally:
        for child in psutil.Process(leader.pid).children(recursive=True):
            child.kill()
        leader.kill()
        leader.wait(5)


def test_health_probe_up_down_and_refused() -> None:
    b = StubBehaviour()

    async def go() -> list[dict[str, float]]:
        out = []
        async with StubServer(b) as srv:
            h = HealthSampler(srv.url + "/health")
            await h.open()
            out.append(_by_name(await h.sample()))
            b.health_status = 503
            out.append(_by_name(await h.sample()))
            await h.close()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            h = HealthSampler(f"http://127.0.0.1:{sock.getsockname()[1]}/health", timeout_s=0.5)
            await h.open()
            out.append(_by_name(await h.sample()))
            await h.close()
        return out

    up, down, refused = asyncio.run(go())
    assert (up["health.up"], up["health.status_code"]) == (1, 200)
    assert (down["health.up"], down["health.status_code"]) == (0, 503)
    assert (refused["health.up"], refused["health.status_code"]) == (0, 0)


def test_prometheus_api_results() -> None:
    doc = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"gpu": "0"}, "value": [1.0, "0.93"]},
                {"metric": {"gpu": "1"}, "value": [1.0, "0.5"]},
            ],
        },
    }
    got = parse_query_result("fb_share", doc, 0.0)
    assert [(s.name, s.labels["gpu"], s.value) for s in got] == [
        ("prometheus.fb_share", "0", 0.93),
        ("prometheus.fb_share", "1", 0.5),
    ]
    with pytest.raises(ValueError, match="bad_data"):
        parse_query_result("x", {"status": "error", "error": "bad_data"}, 0.0)


def test_prometheus_api_sampler_against_a_loopback_api() -> None:
    from aiohttp import web

    async def go() -> list[Sample]:
        async def buildinfo(_r: web.Request) -> web.Response:
            return web.json_response({"status": "success", "data": {"version": "2.45"}})

        async def query(r: web.Request) -> web.Response:
            assert r.query["query"] == "up"
            return web.json_response(
                {"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}}
            )

        app = web.Application()
        app.router.add_get("/api/v1/status/buildinfo", buildinfo)
        app.router.add_get("/api/v1/query", query)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        s = PromApiSampler(f"http://127.0.0.1:{port}", {"up": "up"})
        try:
            await s.open()
            return await s.sample()
        finally:
            await s.close()
            await runner.cleanup()

    assert _by_name(asyncio.run(go())) == {"prometheus.up": 1.0}


@pytest.mark.timeout(20)  # the bug shows as a loop that never ends
def test_sampler_set_stops_even_when_a_cancellation_is_lost(monkeypatch):
    """asyncio.wait_for can swallow a cancel that lands as the sample completes (CPython gh-86296);
    a drill then waited for its sampler loop forever. The time-limit helper is replaced by one that
    loses the cancellation exactly that way: stop() must still end."""
    import asyncio

    from vramlab.observe import base
    from vramlab.observe.base import Sampler, SamplerSet

    async def loses_cancel(awaitable, timeout_s):
        try:
            return await awaitable
        except asyncio.CancelledError:
            return []  # what wait_for returns when the inner result wins the race

    monkeypatch.setattr(base, "_bounded", loses_cancel)

    class Slow(Sampler):
        source = "slow"

        async def sample(self):
            await asyncio.sleep(0.5)
            return []

    async def go():
        sset = SamplerSet([Slow()], 0.05, lambda s: None, lambda n: None)
        await sset.start()
        await asyncio.sleep(0.1)  # the loop is inside sample() when stop() cancels it
        await asyncio.wait_for(sset.stop(), timeout=5)

    asyncio.run(go())
