"""Options and armed faults: bad values are one-line errors; start-up faults fire by themselves."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import time

import aiohttp
import pytest

from vramlab.errors import ConfigError, NotFoundError
from vramlab.sim.config import Fault, SimConfig, estimate_from_json
from vramlab.sim.server import SimServer
from vramlab.sim.testing import make_estimate


def test_fault_parse():
    assert Fault.parse("crash@2.5") == Fault("crash", 2.5, 10.0)
    assert Fault.parse("slow@1:20") == Fault("slow", 1.0, 20.0)
    assert Fault.parse("hang") == Fault("hang", 0.0, 10.0)
    with pytest.raises(ConfigError, match="unknown fault"):
        Fault.parse("melt")
    with pytest.raises(ConfigError, match="bad fault"):
        Fault.parse("crash@soon")


def test_config_errors():
    with pytest.raises(NotFoundError, match="did you mean 'vllm'"):
        SimConfig(engine="vlm")
    with pytest.raises(ConfigError):
        SimConfig(speed=0)
    with pytest.raises(ConfigError):
        SimConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="not a `vramlab plan --json` object"):
        estimate_from_json({"model": "x"})


def test_plan_json_round_trips():
    est = make_estimate(kv_cache_gib=2.0)
    back = estimate_from_json(est.to_json())
    assert (back.kv_cache_bytes, back.num_blocks, back.weights_bytes, back.components) == (
        est.kv_cache_bytes,
        est.num_blocks,
        est.weights_bytes,
        est.components,
    )


@pytest.mark.parametrize(
    "argv,text",
    [
        (["--speed", "0"], "vramlab sim: error: --speed must be a positive finite number, got 0.0"),
        (["--fault", "melt"], "vramlab sim: error: unknown fault 'melt'"),
        (
            ["--plan", "/nonexistent/plan.json"],
            "vramlab sim: error: /nonexistent/plan.json: no such plan JSON file",
        ),
    ],
)
def test_cli_bad_options_are_one_line_errors(argv, text):
    out = subprocess.run(
        [sys.executable, "-m", "vramlab", "sim", "serve", "--port", "0", *argv],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and text in out.stderr and "Traceback" not in out.stderr


def test_armed_slow_then_hang_faults_fire_by_themselves(tmp_path):
    async def go():
        cfg = SimConfig(
            estimate=make_estimate(),
            speed=100,
            device=str(tmp_path / "g.ledger"),
            faults=(Fault("slow", 0.0, 50.0), Fault("hang", 0.6)),
        )
        async with SimServer(cfg, log_stream=io.StringIO()) as srv:
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                r = await s.post(
                    srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5, "ignore_eos": True}
                )
                assert r.status == 200
                slow_s = time.monotonic() - t0
                await asyncio.sleep(0.7)
                hung = asyncio.create_task(
                    s.post(srv.url + "/v1/completions", json={"prompt": "y", "max_tokens": 2})
                )
                await asyncio.sleep(0.3)
                state = await (await s.get(srv.url + "/sim/state")).json()
                done = hung.done()
                hung.cancel()
                return slow_s, done, state

    slow_s, done, state = asyncio.run(asyncio.wait_for(go(), 30))
    # 5 decode steps of ~7.2 ms on an H100, x50 slower, /100 speed: ~18 ms at the least.
    assert slow_s > 0.015
    assert not done and state["faults"] == ["slow", "hang"] and not state["dead"]
