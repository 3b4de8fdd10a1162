"""Plan against measured on a real engine: llama.cpp (llama-cpp-python's server, CPU) on a tiny
random-weight GGUF. The measured model and KV buffers are the ones its start-up log prints, and the
peak is the process's RSS, reported as host memory. Needs VRAMLAB_TEST_LLAMACPP_PYTHON (tests/_llamacpp.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import _llamacpp as lc

pytestmark = pytest.mark.slow
MIB = 1 << 20


@pytest.mark.timeout(300)
def test_llamacpp_composition_is_what_its_log_prints_and_the_peak_is_host_memory(tmp_path: Path) -> None:
    py = lc.engine_python()
    model = lc.write_gguf(tmp_path / "tiny-random.gguf")
    log = tmp_path / "server.log"
    srv = lc.start_server(py, model, log, n_ctx=1024, extra="--model_alias tiny")
    plan = {
        "name": "llamacpp-composition",
        "rounds": 1,
        "target": {
            "base_url": srv.url,
            "api": "openai-completions",
            "model": "tiny",
            "kind": "llama.cpp",
            "pid": srv.proc.pid,
            "log_file": str(log),
        },
        # the CPU build: planned on the host (no CUDA context, the server's runtime as its own term)
        "capacity": {
            "model": str(model),
            "gpu": "cpu",
            "settings": {
                "ctx_size": 1024,
                "parallel": 1,
                "n_ubatch": 64,
                "llamacpp_server": "llama-cpp-python",
            },
        },
        "fixed": {"input": {"synthetic": {"prompt_tokens": 16, "output_tokens": 8, "seed": 1, "count": 8}}},
        "change": {"variable": "concurrency", "steps": [2]},
        "phases": {"duration_s": 1.5, "drain_s": 2.0},
        "load": {"concurrency": 1, "request_timeout_s": 20},
        "samplers": {"interval_s": 0.3, "sources": ["host"]},
    }
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    env = {**os.environ, "VRAMLAB_DB": str(tmp_path / "v.db")}
    try:
        res = subprocess.run(
            [sys.executable, "-m", "vramlab", "run", "plan.yaml", "--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
    finally:
        srv.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    run_id = json.loads(res.stdout)["run_id"]
    rep = subprocess.run(
        [sys.executable, "-m", "vramlab", "report", run_id, "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    comp = json.loads(rep.stdout)["sections"]["composition"]
    text = log.read_text(errors="replace")
    model_mib = float(re.search(r"CPU_Mapped model buffer size\s*=\s*([\d.]+) MiB", text).group(1))  # type: ignore[union-attr]
    kv_mib = float(re.search(r"KV buffer size\s*=\s*([\d.]+) MiB", text).group(1))  # type: ignore[union-attr]
    assert comp["plan"] is not None and comp["plan"]["engine"] == "llama.cpp"
    for row in comp["rows"]:
        f = row["figures"]
        assert round(f["resident_model"]["measured_bytes"] / MIB, 2) == model_mib, f["resident_model"]
        assert round(f["kv_cache"]["measured_bytes"] / MIB, 2) == kv_mib, f["kv_cache"]
        assert f["kv_cache"]["source"].startswith("start-up log")
        peak = f["peak"]
        assert peak["host_memory"] is True and peak["source"].startswith("host memory"), peak
        assert (
            peak["measured_bytes"] > f["resident_model"]["measured_bytes"] + f["kv_cache"]["measured_bytes"]
        )
    # the plan's KV pool for these settings is the engine's, byte for byte
    assert comp["plan"]["kv_cache_bytes"] == round(kv_mib * MIB)
    names = {c["name"] for c in comp["plan"]["components"]}
    assert "cuda_context" not in names and "runtime" in names, names
    # the host's reading of the process lies inside the plan's band for it (runtime + buffers)
    for row in comp["rows"]:
        peak = row["figures"]["peak"]
        assert peak["low_bytes"] <= peak["measured_bytes"] <= peak["high_bytes"], peak
    md = subprocess.run(
        [sys.executable, "-m", "vramlab", "report", run_id, "--format", "md"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    ).stdout
    assert "The peak is host memory (the target process's RSS): this engine ran on the CPU." in md
    assert "[host memory]" in md
