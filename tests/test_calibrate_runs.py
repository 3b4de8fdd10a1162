"""`vramlab calibrate RUN_ID`: learn from stored runs. A sim configured with three times the non-torch
memory the plan assumes is run; calibrate must find that, write a profile with which `plan
--calibration` predicts the run's composition within 2 %, say what it changed, and refuse runs that
cannot teach anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GIB = 1 << 30
MODEL, GPU, LEN = "llama-3.1-8b-instruct", "h100-80gb", 8192

PLAN = """
name: {name}
target:
  base_url: {url}/v1
  model: llama-3.1-8b-instruct
  kind: {kind}
  pid: {pid}
  log_file: {log}
{capacity}
fixed:
  input:
    synthetic: {{prompt_tokens: 512, output_tokens: 32, seed: 3, count: 40}}
  ignore_eos: true
change: {{variable: concurrency, baseline: 1, steps: [32]}}
phases: {{duration_s: 1.2, drain_s: 1}}
rounds: 1
samplers: {{interval_s: 0.2, sources: [ledger, engine], ledger: {ledger}}}
"""


def _vramlab(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VRAMLAB_DB": str(cwd / "s.db")}
    return subprocess.run(
        [sys.executable, "-m", "vramlab", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from vramlab.capacity import Constants, get_gpu
    from vramlab.capacity.planning import make_plan
    from vramlab.capacity.settings import EngineSettings
    from vramlab.sim.launch import start_sim
    from vramlab.sources import resolve_model

    tmp = tmp_path_factory.mktemp("calibrate-runs")
    base = Constants.defaults()
    heavier = base.with_overrides(
        {"non_torch_forward_bytes": (3 * base["non_torch_forward_bytes"], 0.5, "test")}, "sim"
    )
    est = make_plan(resolve_model(MODEL), get_gpu(GPU), EngineSettings(max_model_len=LEN), heavier).to_json()
    (tmp / "sim-plan.json").write_text(json.dumps(est))
    args = ["--model", MODEL, "--gpu", GPU, "--engine", "vllm", "--max-model-len", str(LEN)]
    # prefix caching off: the synthetic prompts share their head, and a cached prefix is not computed again, so
    # the step's activation (and the overhead measured beside it) would be the cache's, not the plan's
    args += ["--speed", "40", "--plan", str(tmp / "sim-plan.json"), "--no-enable-prefix-caching"]
    cap = f"capacity: {{gpu: {GPU}, settings: {{max_model_len: {LEN}}}}}"
    runs = (("learn", "vllm", cap), ("learn2", "vllm", cap), ("held", "vllm", cap), ("blind", "other", ""))
    ids = []
    for name, kind, capacity in runs:
        # a fresh server per run: the device at rest before a run's first request is the start-up's only
        # on a server no earlier run has used (an allocator keeps what a heavy step reserved)
        ledger, log = str(tmp / f"{name}.ledger"), str(tmp / f"{name}.log")
        sim = start_sim(args, device=ledger, log_path=log, timeout_s=60)
        try:
            plan = tmp / f"{name}.yaml"
            plan.write_text(
                PLAN.format(
                    name=name, url=sim.url, pid=sim.pid, log=log, ledger=ledger, kind=kind, capacity=capacity
                )
            )
            res = _vramlab("run", str(plan), "--json", cwd=tmp)
            assert res.returncode == 0, res.stderr[-1500:]
            ids.append(json.loads(res.stdout)["run_id"])
        finally:
            sim.stop()
    return tmp, ids, est


@pytest.mark.timeout(300)
def test_calibrate_learns_the_sims_overhead_and_the_plan_then_predicts_within_two_percent(runs) -> None:
    tmp, (learn, learn2, held, _blind), sim_est = runs
    # one run is below the minimum (3 by default, 2 at the least): refused and named, never fitted from one point
    one = _vramlab("calibrate", learn, "--json", cwd=tmp)
    assert (
        one.returncode == 1
        and "only 1 observation(s) of non_torch_bytes depend on it; 3 needed" in one.stderr
    )
    assert not json.loads(one.stdout)["changed"]
    res = _vramlab(
        "calibrate",
        learn,
        learn2,
        "--min-points",
        "2",
        "--holdout",
        held,
        "-o",
        "runs.toml",
        "--json",
        cwd=tmp,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    changed = {c["constant"]: c for c in out["changed"]}
    nt = changed["non_torch_forward_bytes"]
    assert nt["value"] == pytest.approx(0.75 * GIB, rel=0.02) and nt["runs"] == [learn, learn2]
    assert "overhead at rest" in nt["evidence"]
    # before: the plan's overhead was 0.5 GiB short; after: every figure within 2 %, learned and held out
    for rows in (out["learned"], out["holdout"]):
        by = {r["figure"]: r for r in rows}
        # the composition's four figures, and the start-up log's own (its CUDA graphs line)
        assert set(by) == {"resident_model", "kv_cache", "runtime_overhead", "peak", "cuda_graph"}
        assert by["runtime_overhead"]["before_pct"] < -10
        assert all(abs(r["after_pct"]) <= 2.0 for r in rows), rows
    assert out["holdout"][0]["run_id"] == held
    # plan --calibration with the written profile predicts the run's measured composition within 2 %
    plan = _vramlab(
        "plan",
        "--model",
        MODEL,
        "--gpu",
        GPU,
        "--max-model-len",
        str(LEN),
        "--calibration",
        "runs.toml",
        "--json",
        cwd=tmp,
    )
    assert plan.returncode == 0, plan.stderr
    est = json.loads(plan.stdout)
    report = _vramlab("report", learn, "--format", "json", cwd=tmp)
    rows = json.loads(report.stdout)["sections"]["composition"]["rows"]
    heavy = max(rows, key=lambda r: r["figures"]["peak"]["measured_bytes"])["figures"]
    comps = {c["name"]: c["bytes"] for c in est["components"]}
    predicted = {
        "resident_model": comps["weights"],
        "kv_cache": comps["kv_cache"],
        "runtime_overhead": sum(comps.values()) - comps["weights"] - comps["kv_cache"],
        "peak": sum(comps.values()),
    }
    for name, p in predicted.items():
        m = heavy[name]["measured_bytes"]
        assert abs(p - m) <= 0.02 * m, (name, p / GIB, m / GIB)
    assert est["kv_cache_bytes"] == pytest.approx(sim_est["kv_cache_bytes"], rel=0.002)
    text = _vramlab("calibrate", learn, learn2, "--min-points", "2", "-o", "again.toml", cwd=tmp)
    assert (
        text.returncode == 0 and "non_torch_forward_bytes (non_torch_bytes): 0.250 GiB -> 0.7" in text.stdout
    )
    assert "before" in text.stdout and "profile written to again.toml" in text.stdout


def test_a_run_with_no_plan_or_no_run_is_refused_with_one_line(runs) -> None:
    tmp, (_learn, _learn2, _held, blind), _est = runs
    res = _vramlab("calibrate", blind, cwd=tmp)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert (
        f"run {blind}: no capacity plan stored with it" in res.stderr and "engine is not known" in res.stderr
    )
    res = _vramlab("calibrate", "deadbeef", cwd=tmp)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr


def test_nothing_to_learn_says_what_was_measured_and_why_it_informs_no_constant() -> None:
    # a run whose start-up log gave the weights and the KV pool only: it was read, and it is said so
    from vramlab.capacity import EngineSettings, estimate, get_gpu
    from vramlab.capacity.run_calibration import RunMeasure, calibrate_runs
    from vramlab.sources import resolve_model

    m = RunMeasure(
        "r1",
        "llama.cpp",
        resolve_model("qwen2.5-0.5b-instruct"),
        get_gpu("l4"),
        EngineSettings(engine="llama.cpp", ctx_size=4096, parallel=1),
        {"resident_model": 500 << 20, "kv_cache": 48 << 20},
        None,
        {"weights_bytes": float(500 << 20), "kv_cache_bytes": float(48 << 20)},
        {},
        ("round 1 baseline",),
    )
    cal = calibrate_runs([m], [], lambda s, g, st, c: estimate(s, g, st, c, with_suggestions=False))
    assert not cal.fitted_any
    said = " ".join(cal.not_fitted)
    assert "run r1 measured kv_cache, resident_model, weights" in said and "none of these depends" in said
    assert "no start-up log" not in said
    # planned on the host with no reading of its runtime: why, said beside it
    import dataclasses

    host = dataclasses.replace(m, host=True, runtime_how={"none": "no reading of the server's process tree"})
    cal = calibrate_runs([host], [], lambda s, g, st, c: estimate(s, g, st, c, with_suggestions=False))
    assert "llama.cpp CPU runtime: run r1: no reading of the server's process tree" in cal.not_fitted
