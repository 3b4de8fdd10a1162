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
from _narrow import some

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


@pytest.mark.timeout(300)
def test_a_q8_0_cache_and_an_f16_plan_disagree_in_the_report(tmp_path: Path) -> None:
    # the engine runs a q8_0 cache; the plan's capacity block says nothing of it (f16): the report's
    # measured KV is the buffer llama.cpp printed, and the plan's error shows (not +0.0 %)
    py = lc.engine_python()
    model = lc.write_gguf(tmp_path / "tiny-random.gguf")
    log = tmp_path / "server.log"
    extra = "--model_alias tiny --type_k 8 --type_v 8 --flash_attn true"
    srv = lc.start_server(py, model, log, n_ctx=2048, extra=extra)
    plan = {
        "kind": "experiment",
        "name": "llamacpp-q8",
        "rounds": 1,
        "target": {
            "base_url": srv.url,
            "api": "openai-completions",
            "model": "tiny",
            "kind": "llama.cpp",
            "pid": srv.proc.pid,
            "log_file": str(log),
        },
        "capacity": {"model": str(model), "gpu_memory_gib": 4, "settings": {"ctx_size": 2048, "parallel": 1}},
        "fixed": {"input": {"synthetic": {"prompt_tokens": 32, "output_tokens": 8, "seed": 1, "count": 8}}},
        "change": {"variable": "concurrency", "steps": [2]},
        "phases": {"duration_s": 1.0, "drain_s": 2.0},
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
    text = log.read_text(errors="replace")
    kv_mib = float(re.search(r"KV buffer size\s*=\s*([\d.]+) MiB", text).group(1))  # type: ignore[union-attr]
    assert re.search(r"K \(q8_0\)", text), "the engine did not run a q8_0 cache"
    out = {}
    for fmt in ("json", "md"):
        out[fmt] = subprocess.run(
            [sys.executable, "-m", "vramlab", "report", run_id, "--format", fmt],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        ).stdout
    comp = json.loads(out["json"])["sections"]["composition"]
    planned = comp["plan"]["kv_cache_bytes"]
    assert comp["plan"]["settings"]["cache_type_k"] == "f16"
    for row in comp["rows"]:
        kv = row["figures"]["kv_cache"]
        assert kv["measured_bytes"] == round(kv_mib * MIB) and "printed" in kv["source"]
        assert kv["error_bytes"] == planned - kv["measured_bytes"] > 0
        assert kv["error_pct"] > 50 and kv["inside_band"] is False  # f16 is ~1.9x q8_0's 34 B per 32
    assert f"| {kv_mib:.2f} MiB |" in out["md"] and re.search(
        r"\| \+\d+\.\d% \| no \| start-up log", out["md"]
    )


def _run_at(tmp_path: Path, model: Path, n_ctx: int, env: dict[str, str]) -> str:
    """One short run against a server started with *n_ctx* (its own log); the run id."""
    py = lc.engine_python()
    log = tmp_path / f"server-{n_ctx}.log"
    srv = lc.start_server(py, model, log, n_ctx=n_ctx, extra="--model_alias tiny")
    plan = {
        "kind": "experiment",
        "name": f"llamacpp-{n_ctx}",
        "rounds": 1,
        "target": {
            "base_url": srv.url,
            "api": "openai-completions",
            "model": "tiny",
            "kind": "llama.cpp",
            "pid": srv.proc.pid,
            "log_file": str(log),
        },
        "capacity": {
            "model": str(model),
            "gpu_memory_gib": 4,
            "settings": {"ctx_size": n_ctx, "parallel": 1},
        },
        "fixed": {"input": {"synthetic": {"prompt_tokens": 32, "output_tokens": 8, "seed": 1, "count": 8}}},
        "change": {"variable": "concurrency", "steps": [2]},
        "phases": {"duration_s": 1.0, "drain_s": 2.0},
        "load": {"concurrency": 1, "request_timeout_s": 20},
        "samplers": {"interval_s": 0.3, "sources": ["host"]},
    }
    (tmp_path / f"plan-{n_ctx}.yaml").write_text(yaml.safe_dump(plan))
    try:
        res = subprocess.run(
            [sys.executable, "-m", "vramlab", "run", f"plan-{n_ctx}.yaml", "--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
    finally:
        srv.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    return str(json.loads(res.stdout)["run_id"])


@pytest.mark.timeout(400)
def test_calibrate_learns_the_compute_buffer_from_one_run_and_holds_on_another(tmp_path: Path) -> None:
    # runs with other settings (1,024, 2,048 and 4,096 cells: the compute buffer's KQ matrix grows with
    # them); two teach (a constant needs two observations at least), the third is held out; each is
    # planned with the settings its log printed
    model = lc.write_gguf(tmp_path / "tiny-random.gguf")
    env = {**os.environ, "VRAMLAB_DB": str(tmp_path / "v.db")}
    learn, learn2 = _run_at(tmp_path, model, 1024, env), _run_at(tmp_path, model, 2048, env)
    held = _run_at(tmp_path, model, 4096, env)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "calibrate",
            learn,
            learn2,
            "--min-points",
            "2",
            "--holdout",
            held,
            "-o",
            "lc.toml",
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    (change,) = [c for c in out["changed"] if c["constant"] == "llamacpp_compute_scratch_bytes"]
    assert change["runs"] == [learn, learn2] and "compute buffer" in change["evidence"]
    said = re.search(
        r"CPU compute buffer size\s*=\s*([\d.]+) MiB", (tmp_path / "server-4096.log").read_text()
    )
    logged = float(some(said).group(1))
    (h,) = [r for r in out["holdout"] if r["figure"] == "activation_peak"]
    assert (
        round(h["measured_bytes"] / MIB, 2) == logged
    )  # the held-out run's own compute buffer, from its log
    assert abs(h["after_pct"]) < abs(h["before_pct"]) and abs(h["after_pct"]) <= 2.0, h
    assert any("planned with the settings its start-up log printed" in r for r in out["sources"][learn])
    assert any("CPU runtime" in n for n in out["not_fitted"]), out["not_fitted"]  # said, never dropped
    text = subprocess.run(
        [sys.executable, "-m", "vramlab", "calibrate", learn, learn2, "--min-points", "2", "--holdout", held],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    ).stdout
    assert "error held out (not learned from)" in text and re.search(r"activation_peak .* -> after", text), (
        text
    )
