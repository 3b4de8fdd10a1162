"""`vramlab compare` of two runs that differ only in the engine version (or one declared variable):
a regression comparison with memory composition and latency side by side, the plans' predicted
change beside the measured one, and a verdict, instead of a refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import _synthetic_run as synth
from vramlab.analysis.compare import MetricDelta
from vramlab.analysis.regression import Difference, MemoryChange, judge, subject_of
from vramlab.store import open_store

VRAMLAB = str(Path(sys.executable).with_name("vramlab"))
GIB = 1 << 30


def _diff(*items: tuple[str, object, object]) -> list[Difference]:
    return [Difference(k, a, b) for k, a, b in items]


def test_the_engine_version_alone_is_a_regression_subject():
    v = ("engine_version", "0.11.0", "0.29.0")
    args = ("target.sim.extra_args", ["--engine-version", "0.11.0"], ["--engine-version", "0.29.0"])
    assert subject_of(_diff(v)) == Difference(*v)
    assert subject_of(_diff(v, args)) == Difference(*v)  # the sim's flag says the same thing
    assert subject_of(_diff(v, ("model", "a", "b"))) is None  # and something else: different experiments
    assert subject_of(_diff(("model", "a", "b"))) is None  # another single difference needs --vary
    assert subject_of(_diff(("model", "a", "b")), "model") == Difference("model", "a", "b")
    sim = _diff(("target.sim.max_num_seqs", 8, 16), ("target.sim.seed", 1, 2))
    got = subject_of(sim, "target.sim")
    assert got is not None and got.a == {"target.sim.max_num_seqs": 8, "target.sim.seed": 1}
    assert subject_of(sim, "target.sim.seed") is None  # max_num_seqs differs too


def test_the_verdict_weighs_memory_latency_and_errors_above_their_floors():
    pool = MemoryChange("kv_cache", 16 * GIB, int(16.5 * GIB), 16 * GIB, int(16.5 * GIB))
    peak = MemoryChange("peak", 20 * GIB, 20 * GIB + (10 << 20), None, None)  # +10 MiB: noise
    assert judge([pool, peak], []) == ("improved", ["kv cache +0.50 GiB measured"])
    slower = MetricDelta("treatment", "8", "e2e_p95_ms", 100.0, 140.0)
    counts = {("treatment", "8"): 100.0}
    verdict, why = judge([pool], [slower], counts)
    assert verdict == "regressed" and why[0].startswith("e2e_p95_ms 100.0 -> 140.0 ms (+40%)")
    assert judge([], [slower], {("treatment", "8"): 12.0}) == ("no change", [])  # too few requests to say
    assert judge([], [MetricDelta("treatment", "8", "e2e_p95_ms", 100.0, 103.0)], counts)[0] == "no change"
    errors = MetricDelta("baseline", "1", "error_rate", 0.0, 0.05)
    assert judge([], [errors], counts)[0] == "regressed"


def test_runs_differing_in_something_else_are_still_refused_and_vary_names_it(tmp_path):
    db = str(tmp_path / "v.db")
    with open_store(db) as store:
        synth.insert(store, "7f3a91bc", started_at=1_760_000_000.0)
        synth.insert(store, "7f3b0000", started_at=1_760_000_100.0, model="qwen2.5-7b-instruct")
    res = subprocess.run(
        [VRAMLAB, "compare", "7f3a", "7f3b", "--db", db], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "--vary FIELD" in res.stderr
    res = subprocess.run(
        [VRAMLAB, "compare", "7f3a", "7f3b", "--vary", "model", "--json", "--db", db],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["schema"] == "vramlab.regression/1" and out["subject"]["key"] == "model"
    assert out["verdict"] == "no change" and out["latency"]
    wrong = subprocess.run(
        [VRAMLAB, "compare", "7f3a", "7f3b", "--vary", "engine_version", "--db", db],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 2 and "differ in more than engine_version: model" in wrong.stderr


PLAN = """kind: experiment
name: release-check
target:
  kind: sim
  model: qwen2.5-1.5b-instruct
  sim: {{gpu: l4, engine: vllm, speed: 40, max_model_len: 4096, max_num_seqs: 64, seed: 7,
         extra_args: [--engine-version, "{version}"]}}
fixed:
  input: {{synthetic: {{prompt_tokens: 512, output_tokens: 32, seed: 7, count: 50}}}}
  ignore_eos: true
change: {{variable: concurrency, baseline: 1, steps: [8]}}
phases: {{duration_s: 2, drain_s: 2}}
rounds: 1
load: {{mode: closed, concurrency: 1}}
samplers: {{interval_s: 0.25, sources: [ledger, engine, health]}}
"""


@pytest.mark.slow
def test_two_releases_on_the_rehearsal_server(tmp_path):
    """vLLM 0.11.0 against 0.29.0 (the sim sizes its memory with each release's rules): the measured
    KV pool grows with 0.29's default utilization of 0.92 (UTIL_092_FROM), as both stored plans say."""
    db = str(tmp_path / "v.db")
    ids = []
    for version in ("0.11.0", "0.29.0"):
        (tmp_path / f"{version}.yaml").write_text(PLAN.format(version=version))
        r = subprocess.run(
            [VRAMLAB, "run", str(tmp_path / f"{version}.yaml"), "--db", db, "--json"],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        ids.append(json.loads(r.stdout)["run_id"])
    res = subprocess.run(
        [VRAMLAB, "compare", *ids, "--json", "--db", db], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["subject"] == {"key": "engine_version", "a": "0.11.0", "b": "0.29.0"}
    mem = {m["figure"]: m for m in out["memory"]}
    pool = mem["kv_cache"]
    # measured from the sim's own start-up log, planned by each run's own stored plan: the same change
    assert pool["measured_delta_bytes"] > 0 and pool["predicted_delta_bytes"] > 0
    assert (
        abs(pool["measured_delta_bytes"] - pool["predicted_delta_bytes"])
        <= 0.05 * pool["predicted_delta_bytes"]
    )
    assert mem["peak"]["measured_a_bytes"] and mem["peak"]["measured_b_bytes"]
    changes = {c["item"]: c for c in out["plan_changes"]}
    assert "UTIL_092_FROM" in changes["gpu_memory_utilization"]["rules"]
    assert "kv_cache" in changes
    metrics = {(d["phase"], d["metric"]) for d in out["latency"]}
    assert ("treatment", "e2e_p95_ms") in metrics and ("baseline", "ttft_p95_ms") in metrics
    assert out["verdict"] in ("improved", "regressed", "no change") and (out["verdict"] == "no change") == (
        not out["reasons"]
    )
    text = subprocess.run([VRAMLAB, "compare", *ids, "--db", db], capture_output=True, text=True, timeout=120)
    assert "differ only in engine_version: '0.11.0' -> '0.29.0'" in text.stdout
    assert "planned change" in text.stdout and "UTIL_092_FROM" in text.stdout
