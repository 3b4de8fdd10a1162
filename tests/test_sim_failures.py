"""Each failure mode observed from outside: exit code, log text, status codes, /health, the card."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from vramlab.sim.config import SimConfig
from vramlab.sim.engine import StartupRefused
from vramlab.sim.launch import start_sim
from vramlab.sim.ledger import DeviceLedger
from vramlab.sim.server import SimServer
from vramlab.sim.testing import make_estimate
from vramlab.units import GIB

VRAMLAB = [sys.executable, "-m", "vramlab"]


def _plan(tmp_path, name="plan.json", **kw) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(make_estimate(**kw).to_json()))
    return str(path)


def _health(url: str) -> int | str:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return "refused"


def test_startup_refused_when_a_cotenant_holds_memory(tmp_path):
    device = str(tmp_path / "gpu0.ledger")
    balloon = subprocess.Popen(
        [*VRAMLAB, "sim", "balloon", "--device", device, "--gpu", "h100-80gb", "--gib", "30"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert balloon.stdout is not None and "holding 30.00 GiB" in balloon.stdout.readline()
        sim = start_sim(["--plan", _plan(tmp_path), "--speed", "50"], device=device, wait_ready=False)
        assert sim.wait(30) == 1
        log = sim.log_text()
        assert (
            "ValueError: Free memory on device cuda:0 (49.19/79.19 GiB) on startup is less than desired GPU "
            "memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used "
            "by other processes."
        ) in log
        assert "RuntimeError: Engine core initialization failed" in log
        assert DeviceLedger(device).processes()[0][2] == "vramlab-balloon"  # the refused engine holds nothing
    finally:
        balloon.send_signal(signal.SIGINT)
        balloon.wait(10)
    assert DeviceLedger(device).memory_info()[1] == 0


def test_max_model_len_beyond_the_pool_is_refused_with_the_largest_length(tmp_path):
    plan = _plan(tmp_path, kv_cache_gib=0.2, max_model_len=8192)  # 0.2 GiB / 128 KiB = 1,638 tokens
    out = subprocess.run(
        [
            *VRAMLAB,
            "sim",
            "serve",
            "--plan",
            plan,
            "--speed",
            "100",
            "--port",
            "0",
            "--device",
            str(tmp_path / "g.ledger"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert (
        "To serve at least one request with the models's max seq len (8192), (1.00 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (0.20 GiB). Based on the available memory, the "
        "estimated maximum model length is 1632."
    ) in out.stdout


def test_no_memory_for_cache_blocks_and_the_start_up_race(tmp_path):
    """Two engines started together each charge the other's loading to themselves (vllm #55827)."""
    device = str(tmp_path / "gpu0.ledger")

    async def start(cfg):
        srv = SimServer(cfg, log_stream=open(os.devnull, "w"))
        try:
            await srv.start()
            return srv
        except StartupRefused as exc:
            return exc

    async def go():
        est = make_estimate(
            util=0.35
        )  # KV alone: 0.35 x 79.19 - 17.19 = 10.5 GiB, less than a 15 GiB neighbour
        cfg = SimConfig(estimate=est, device=device, speed=50)
        together = await asyncio.gather(start(cfg), start(cfg))
        for r in together:
            if isinstance(r, SimServer):
                await r.stop()
        first = await start(cfg)
        second = await start(cfg)
        for r in (first, second):
            if isinstance(r, SimServer):
                await r.stop()
        return together, first, second

    together, first, second = asyncio.run(asyncio.wait_for(go(), 60))
    refused = [r for r in together if isinstance(r, StartupRefused)]
    assert refused and all("No available memory for the cache blocks" in str(r) for r in refused)
    assert isinstance(first, SimServer) and isinstance(second, SimServer)  # one after the other: both fit
    assert DeviceLedger(device).memory_info()[1] == 0


def test_runtime_oom_from_a_balloon_kills_the_engine(tmp_path):
    device = str(tmp_path / "gpu0.ledger")
    sim = start_sim(["--plan", _plan(tmp_path), "--speed", "50", "--watchdog-s", "1.5"], device=device)
    try:
        dev = DeviceLedger(device)
        free = dev.memory_info()[2]
        dev.allocate(free, "balloon", "co-tenant")  # the headroom activations would have grown into

        async def requests():
            async with aiohttp.ClientSession() as s:
                stream = await s.post(
                    sim.url + "/v1/completions", json={"prompt": "x " * 300, "max_tokens": 50, "stream": True}
                )
                plain = await s.post(
                    sim.url + "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "y"}], "max_tokens": 5},
                )
                return stream.status, await stream.text(), plain.status, await plain.json()

        s_status, s_text, p_status, p_body = asyncio.run(asyncio.wait_for(requests(), 20))
        assert s_status == 200 and '"code": 500' in s_text and s_text.rstrip().endswith("data: [DONE]")
        assert p_status == 500 and p_body["error"]["type"] == "InternalServerError"
        assert _health(sim.url) == 503
        t0 = time.monotonic()
        assert sim.wait(15) == 1
        assert 0.5 < time.monotonic() - t0 < 10
        log = sim.log_text()
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in log
        assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue." in log
        assert "failed (engine dead)." in log
        assert _health(sim.url) == "refused"
        assert [p[2] for p in dev.processes()] == ["co-tenant"]  # the dead engine's memory went back
    finally:
        sim.kill()


def test_crash_fault_and_sigkill_release_the_card(tmp_path):
    device = str(tmp_path / "gpu0.ledger")
    plan = _plan(tmp_path, util=0.4)
    crashing = start_sim(
        [
            "--plan",
            plan,
            "--speed",
            "50",
            "--allow-fault-injection",
            "--watchdog-s",
            "0.2",
            "--engine",
            "vllm",
        ],
        device=device,
    )
    victim = start_sim(["--plan", plan, "--speed", "50"], device=device)
    try:
        dev = DeviceLedger(device)
        assert {p[0] for p in dev.processes()} == {crashing.pid, victim.pid}
        req = urllib.request.Request(
            crashing.url + "/sim/fault",
            data=b'{"kind": "crash"}',
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        assert urllib.request.urlopen(req, timeout=5).status == 200
        assert crashing.wait(15) == 1
        assert "EngineDeadError" in crashing.log_text()
        assert victim.kill() == -signal.SIGKILL
        assert dev.memory_info()[1] == 0
    finally:
        crashing.kill()
        victim.kill()


def test_status_and_balloon_cli(tmp_path):
    device = str(tmp_path / "gpu0.ledger")
    out = subprocess.run(
        [*VRAMLAB, "sim", "balloon", "--device", device, "--gpu", "l4", "--gib", "99"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "CUDA out of memory" in out.stderr and "Traceback" not in out.stderr
    held = subprocess.Popen(
        [*VRAMLAB, "sim", "balloon", "--device", device, "--leave-gib", "2", "--hold-s", "20"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert held.stdout is not None and "holding 20.49 GiB" in held.stdout.readline()
        status = json.loads(
            subprocess.run(
                [*VRAMLAB, "sim", "status", "--device", device, "--json"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
        )
        assert status["free_bytes"] == 2 * GIB and status["processes"][0]["pid"] == held.pid
        assert status["processes"][0]["by_kind"] == {"balloon": status["used_bytes"]}
        table = subprocess.run(
            [*VRAMLAB, "sim", "status", "--device", device], capture_output=True, text=True, timeout=30
        ).stdout
        assert "L4 (simulated)" in table and "vramlab-balloon" in table
    finally:
        held.terminate()
        assert held.wait(10) == 0
    assert DeviceLedger(device).memory_info()[1] == 0


@pytest.mark.parametrize(
    "engine,text",
    [
        ("sglang", "Received sigquit from a child process"),
        ("tgi", "Shard 0 crashed"),
        ("llama.cpp", "cudaMalloc failed: out of memory"),
    ],
)
def test_runtime_oom_texts_of_other_engines(tmp_path, engine, text):
    async def go():
        cfg = SimConfig(
            estimate=make_estimate(engine=engine),
            engine=engine,
            device=str(tmp_path / "g.ledger"),
            speed=100,
            watchdog_s=0.1,
            allow_fault_injection=True,
        )
        async with SimServer(cfg, log_stream=open(os.devnull, "w")) as srv:
            async with aiohttp.ClientSession() as s:
                await s.post(srv.url + "/sim/fault", json={"kind": "oom"})
                r = await s.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3})
                health = (await s.get(srv.url + "/health")).status
                code = await asyncio.wait_for(srv.wait_exit(), 5)
                return r.status, health, code, "\n".join(srv.log.lines)

    status, health, code, log = asyncio.run(asyncio.wait_for(go(), 30))
    assert status == 500 and health == 503
    assert code == (134 if engine == "llama.cpp" else 1)
    assert text in log
