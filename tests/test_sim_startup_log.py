"""The sim's start-up logs are read back by `vramlab.logs` (what `vramlab check-log` uses)."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys

import pytest

from vramlab.capacity.estimate import Estimate
from vramlab.sim.config import SimConfig
from vramlab.sim.server import SimServer
from vramlab.sim.testing import make_estimate

parse_log = pytest.importorskip("vramlab.logs.detect").parse_log


def _log(engine: str, version: str | None = None) -> tuple[list[str], Estimate]:
    est = make_estimate(engine=engine, kv_cache_gib=3.0)

    async def go():
        cfg = SimConfig(engine=engine, engine_version=version, estimate=est, speed=200)
        async with SimServer(cfg, log_stream=io.StringIO()) as srv:
            return list(srv.log.lines)

    return asyncio.run(go()), est


@pytest.mark.parametrize(
    "engine,version",
    [("vllm", None), ("vllm", "0.9.2"), ("sglang", None), ("tgi", None), ("llama.cpp", None)],
)
def test_the_log_parser_reads_what_the_sim_decided(engine, version):
    lines, est = _log(engine, version)
    parsed = parse_log(lines)
    assert parsed.engine == engine and parsed.observations
    obs = parsed.observations[0]
    pool_tokens = est.num_blocks * est.block_size
    if engine == "llama.cpp":
        assert obs.kv_cache_tokens == est.kv_cache_bytes // est.kv_bytes_per_token
    else:
        assert obs.kv_cache_tokens == pool_tokens
    if engine != "tgi":  # TGI prints blocks and tokens only
        assert abs(obs.weights_bytes - est.weights_bytes) < 0.01 * (1 << 30)


def test_cli_serves_the_capacity_model_and_says_so_in_the_log(tmp_path):
    """End to end with the real capacity model: the log's KV line equals `vramlab plan`'s pool."""
    capacity = pytest.importorskip("vramlab.capacity")
    if not hasattr(capacity, "estimate"):
        pytest.skip("capacity model not built yet")
    from vramlab.sim.config import compute_estimate
    from vramlab.sim.launch import start_sim

    cfg = SimConfig(model="llama-3.1-8b-instruct", gpu="h100-80gb", max_model_len=4096)
    est = compute_estimate(cfg)
    sim = start_sim(
        [
            "--model",
            "llama-3.1-8b-instruct",
            "--gpu",
            "h100-80gb",
            "--max-model-len",
            "4096",
            "--speed",
            "100",
        ],
        device=str(tmp_path / "g.ledger"),
    )
    try:
        log = sim.log_text()
        assert f"GPU KV cache size: {est.num_blocks * est.block_size:,} tokens" in log
        out = subprocess.run(
            [sys.executable, "-m", "vramlab", "sim", "status", "--device", str(tmp_path / "g.ledger")],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        assert "VLLM::EngineCore" in out
    finally:
        assert sim.stop() == 0
