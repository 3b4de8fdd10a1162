"""End to end against a real engine: llama.cpp (llama-cpp-python's server, CPU) on a tiny
random-weight GGUF written by the test. Needs the engine scripts/test installs
(VRAMLAB_TEST_LLAMACPP_PYTHON); skips with the reason without it, fails under scripts/test.

Bounded: every server is started with a free port and stopped by the test or the drill's
rollback; each test has a wall-clock limit well inside pytest's timeout.
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
from pathlib import Path
from typing import Any

import pytest
import yaml

import _llamacpp as lc
from _narrow import some
from vramlab.analysis.incident import analyse
from vramlab.store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    py = lc.engine_python()
    model = lc.write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-random.gguf")
    return py, model


def _vramlab(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramlab", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "VRAMLAB_DB": str(cwd / "v.db")},
    )


def _run_plan(url: str, duration_s: float = 2.0, timeout_s: float = 20.0) -> dict:
    return {
        "name": "llamacpp-e2e",
        "rounds": 1,
        "target": {"base_url": url, "api": "openai-completions", "model": "tiny", "kind": "llama.cpp"},
        "fixed": {"input": {"synthetic": {"prompt_tokens": 16, "output_tokens": 8, "seed": 1, "count": 8}}},
        "change": {"variable": "concurrency", "steps": [2]},
        "phases": {"duration_s": duration_s, "drain_s": 2.0},
        "load": {"concurrency": 1, "request_timeout_s": timeout_s},
        "stop_conditions": {"error_rate": 0.5, "window_s": 5, "min_requests": 5},
        "samplers": {"interval_s": 0.5, "sources": ["host", "health"]},
    }


def test_run_against_the_real_engine(engine, tmp_path):
    py, model = engine
    srv = lc.start_server(py, model, tmp_path / "server.log", extra="--model_alias tiny")
    try:
        (tmp_path / "plan.yaml").write_text(yaml.safe_dump(_run_plan(srv.url)))
        res = _vramlab("run", "plan.yaml", "--db", str(tmp_path / "v.db"), "--json", cwd=tmp_path)
    finally:
        srv.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    store = open_store(str(tmp_path / "v.db"))
    reqs = [r for r in store.requests(out["run_id"]) if r.error_class != "cancelled"]
    assert len(reqs) >= 4 and all(r.ok for r in reqs), [r.error for r in reqs if not r.ok][:3]
    assert {r.phase for r in reqs} == {"baseline", "treatment", "recovery"}
    assert all((r.output_tokens or 0) > 0 and r.ttft_ms is not None for r in reqs)
    # no usage in this server's stream and no count of its own: the chunks are counted, the empty-text
    # ones too (it sends a token that ends inside a UTF-8 character as empty text, its bytes later), so
    # the count is close to the 8 generated (the model never ends early) and labelled an estimate
    counts = [r.output_tokens or 0 for r in reqs]
    assert abs(sum(counts) / len(counts) - 8) <= 1.0, counts
    assert {r.output_tokens_source for r in reqs} == {"chunks"}
    from vramlab.report import load_context, render

    md = render(load_context(store, out["run_id"]), "md")
    assert f"out tok/s is an estimate for {len([r for r in reqs if r.ok])} of" in md
    assert re.search(r"Host \(sampled\): CPU max \d+ %", md), md[
        :3000
    ]  # the host sampler's figures, not JSON only
    run = store.get_run(out["run_id"])
    assert run.fixed.get("engine") == "llama.cpp"
    # no /health on this server: the health sampler found /v1/models and said so
    assert any("/health answered HTTP 404" in n and "/v1/models" in n for n in run.notes), run.notes
    up = [s.value for s in store.samples(out["run_id"]) if s.name == "health.up"]
    assert up and max(up) == 1.0  # the discovered path answers (a probe may still time out on a busy box)


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_each_step_sends_its_own_prompt_counted_by_the_engine(engine, tmp_path, api):
    # llama-cpp-python streams no usage: each prompt is sized and counted with its own tokenizer
    # (POST /extras/tokenize) before it is sent, the chat template's share measured by one probe
    # request; on this tiny vocabulary a word is several tokens, so words alone would miss by 3-4x
    py, model = engine
    srv = lc.start_server(py, model, tmp_path / "server.log", n_ctx=1024, extra="--model_alias tiny")
    plan = _run_plan(srv.url, duration_s=1.5)
    plan["target"]["api"] = api
    plan["fixed"]["input"]["synthetic"]["prompt_tokens"] = 64
    plan["change"] = {"variable": "prompt_tokens", "steps": [128, 400]}
    try:
        (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
        res = _vramlab("run", "plan.yaml", "--db", str(tmp_path / "v.db"), "--json", cwd=tmp_path)
    finally:
        srv.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    store = open_store(str(tmp_path / "v.db"))
    run_id = json.loads(res.stdout)["run_id"]
    run = store.get_run(run_id)
    assert any(
        "counted with the engine's POST /extras/tokenize (llama-cpp-python)" in n for n in run.notes
    ), run.notes
    groups: dict[tuple[str, float], list[Any]] = {}
    for r in store.requests(run_id):
        groups.setdefault((r.phase, r.step_value or 0.0), []).append(r)
    assert {v for _, v in groups} == {64.0, 128.0, 400.0}
    for (phase, value), rs in groups.items():
        near = [r for r in rs if r.prompt_tokens and abs(r.prompt_tokens - value) <= 0.02 * value]
        assert len(near) >= 0.95 * len(rs), (phase, value, sorted({r.prompt_tokens for r in rs}))
        assert {r.prompt_tokens_source for r in rs} == {"tokenizer"}
    # the engine's own words: llama-cpp-python logs each request's cached + evaluated prompt tokens
    logged = {
        int(a) + int(b)
        for a, b in re.findall(
            r"Llama.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval",
            (tmp_path / "server.log").read_text(errors="replace"),
        )
    }
    stored = {r.prompt_tokens for rs in groups.values() for r in rs if r.error_class is None}
    assert stored and stored <= logged, (stored, logged)
    from vramlab.report import load_context, render

    md = render(load_context(store, run_id), "md")
    assert re.search(
        r"Prompt tokens of [\d,]+ requests: counted in the target's tokenizer before sending", md
    )


def test_check_log_reads_the_real_start_up_log(engine, tmp_path):
    py, model = engine
    srv = lc.start_server(py, model, tmp_path / "server.log", n_ctx=1024)
    srv.stop()
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert re.search(r"KV buffer size\s*=\s*[\d.]+ MiB", log), log[-3000:]
    # a CPU log prints no GPU memory: the card is named (the KV bytes do not depend on it)
    res = _vramlab(
        "check-log",
        str(tmp_path / "server.log"),
        "--model",
        str(model),
        "--engine",
        "llama.cpp",
        "--gpu",
        "l4",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-2000:])
    doc = json.loads(res.stdout)
    logged_kv = float(re.search(r"KV buffer size\s*=\s*([\d.]+) MiB", log).group(1)) * 2**20  # type: ignore[union-attr]
    # the KV figure was read (whatever shape the parsers give it): some "kv...bytes" field holds the logged size
    found: list[float] = []

    def walk(node: object, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, str(k))
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, (int, float)) and "kv" in key.lower() and "bytes" in key.lower():
            found.append(float(node))

    walk(doc)
    assert logged_kv in found, (logged_kv, found)


def test_check_log_reads_two_start_ups_in_one_file_as_two(engine, tmp_path):
    # a restart in a drill's target log, or two runs appended: each start-up on its own, none summed
    py, model = engine
    both = tmp_path / "both.log"
    logged = []
    for i, n_ctx in enumerate((512, 1024)):
        srv = lc.start_server(py, model, tmp_path / f"s{i}.log", n_ctx=n_ctx)
        srv.stop()
        text = (tmp_path / f"s{i}.log").read_text(errors="replace")
        logged.append(round(float(re.search(r"KV buffer size\s*=\s*([\d.]+) MiB", text).group(1)) * 2**20))  # type: ignore[union-attr]
        with open(both, "a") as fh:
            fh.write(text)
    res = _vramlab(
        "check-log",
        str(both),
        "--model",
        str(model),
        "--engine",
        "llama.cpp",
        "--gpu",
        "l4",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    obs = json.loads(res.stdout)["observations"]
    assert [o["startup"] for o in obs] == [0, 1], [o.get("startup") for o in obs]
    assert [o["settings"]["ctx_size"] for o in obs] == [512, 1024]
    assert [o["kv_cache_bytes"] for o in obs] == logged  # each its own, not their sum
    assert all(o["prediction"]["relative_difference"]["kv_cache_bytes"] == 0.0 for o in obs)


def _kv_bytes_logged(py: str, model: Path, n_ctx: int, n_seq: int, cache: str) -> tuple[int, str]:
    """Create a llama.cpp context with the low-level API (the server has one slot; a context can have
    several) and read the KV size llama.cpp logs: 'llama_kv_cache: size = X MiB (...)'."""
    types = {"f16": 1, "q8_0": 8, "q4_0": 2}
    script = f"""
import llama_cpp as L
L.llama_backend_init()
mp = L.llama_model_default_params()
m = L.llama_model_load_from_file({str(model)!r}.encode(), mp)
cp = L.llama_context_default_params()
cp.n_ctx = {n_ctx}; cp.n_seq_max = {n_seq}; cp.n_batch = 64; cp.n_ubatch = 64; cp.n_threads = 1
cp.type_k = {types[cache]}; cp.type_v = {types[cache]}
if {cache != "f16"!r}:
    cp.flash_attn_type = 1  # a quantized V cache needs flash attention
ctx = L.llama_init_from_model(m, cp)
assert ctx, "no context"
"""
    res = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=120)
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-3000:]
    sizes = [float(x) for x in re.findall(r"llama_kv_cache:\s+size\s*=\s*([\d.]+) MiB", text)]
    assert sizes, text[-3000:]
    return round(sum(sizes) * 2**20), text


@pytest.mark.parametrize(
    ("n_ctx", "slots", "cache"),
    [
        (512, 1, "f16"),
        (2048, 1, "f16"),
        (2048, 4, "f16"),
        (1024, 2, "q8_0"),
        (4096, 1, "q4_0"),
        (1000, 3, "f16"),
    ],
)  # per-slot padding: 3 x 512 cells
def test_plan_kv_bytes_match_the_engine(engine, tmp_path, n_ctx, slots, cache):
    py, model = engine
    logged, text = _kv_bytes_logged(py, model, n_ctx, slots, cache)
    res = _vramlab(
        "plan",
        "--model",
        str(model),
        "--engine",
        "llama.cpp",
        "--ctx-size",
        str(n_ctx),
        "--parallel",
        str(slots),
        "--kv-cache-dtype",
        cache,
        "--gpu-memory-gib",
        "8",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    planned = json.loads(res.stdout)["kv_cache_bytes"]
    # the log prints MiB with two decimals: equal to within its rounding (0.005 MiB)
    assert abs(planned - logged) <= 0.005 * 2**20, (planned, logged, re.findall(r"llama_kv_cache.*", text))


def _compute_logged(py: str, model: Path, n_ctx: int, n_seq: int, n_ubatch: int) -> float:
    """The compute buffer (MiB) llama.cpp prints for a context of *n_seq* sequences, no flash attention."""
    script = f"""
import llama_cpp as L
L.llama_backend_init()
m = L.llama_model_load_from_file({str(model)!r}.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = {n_ctx}; cp.n_seq_max = {n_seq}; cp.n_batch = 512; cp.n_ubatch = {n_ubatch}; cp.n_threads = 1
cp.flash_attn_type = 0
assert L.llama_init_from_model(m, cp), "no context"
"""
    res = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=120)
    text = res.stdout + res.stderr
    found = re.findall(r"compute buffer size\s*=\s*([\d.]+) MiB", text)
    assert res.returncode == 0 and found, text[-3000:]
    return float(found[-1])


@pytest.mark.parametrize(
    ("n_ctx", "slots", "n_ubatch"), [(2048, 1, 512), (2048, 4, 512), (8192, 4, 512), (2048, 4, 64)]
)
def test_plan_compute_buffer_follows_the_slots_streams(engine, tmp_path, n_ctx, slots, n_ubatch):
    # without a unified cache each slot is its own KV stream and the attention graph reads one stream's
    # cells: four slots over 2,048 cells print 6.51 MiB, not the 21.51 MiB of one slot over all of them
    from vramlab.capacity.constants import Constants

    py, model = engine
    logged = _compute_logged(py, model, n_ctx, slots, n_ubatch)
    res = _vramlab(
        "plan",
        "--model",
        str(model),
        "--engine",
        "llama.cpp",
        "--ctx-size",
        str(n_ctx),
        "--parallel",
        str(slots),
        "--ubatch-size",
        str(n_ubatch),
        "--flash-attn",
        "off",
        "--gpu-memory-gib",
        "8",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    comps = {c["name"]: c["bytes"] for c in json.loads(res.stdout)["components"]}
    graph = comps["activation_peak"] - Constants.defaults()["llamacpp_compute_scratch_bytes"]
    # the graph's phases, against the CPU build's printed buffer (two decimals of MiB)
    assert abs(graph / 2**20 - logged) <= 0.01 * logged + 0.01, (graph / 2**20, logged)


# ---- drills ---------------------------------------------------------------------------------


def _drill_doc(py: str, model: Path, tmp_path: Path, command: str, **over) -> dict:
    port = lc.free_port()
    doc: dict[str, Any] = {
        "kind": "drill",
        "name": "llamacpp-kill",
        "rounds": 1,
        "baseline_s": 2.0,
        "target": {
            "kind": "process",
            "environment": "test",
            "engine": "llama.cpp",
            "base_url": f"http://127.0.0.1:{port}",
            "model": "tiny",
            "command": command,
            "log_file": str(tmp_path / "target.log"),
        },
        "load": {
            "concurrency": 2,
            "prompt_tokens": 16,
            "max_tokens": 8,
            "request_timeout_s": 20,
            "retry": {"policy": "none"},
        },
        "ramp": {
            "knob": "concurrency",
            "mode": "geometric",
            "start": 2,
            "factor": 2,
            "ceiling": 8,
            "step_s": 3,
        },
        "stop_conditions": {"error_rate": 0.5, "window_s": 2, "min_requests": 3, "wall_clock_s": 170},
        "recovery": {"mode": "auto", "limit_s": 60, "observe_s": 2, "p95_tolerance": 20},
    }
    for k, v in over.items():
        doc[k] = {**doc[k], **v} if isinstance(v, dict) else v
    return doc


def _drill_with_kill(doc: dict, tmp_path: Path, kill_at_step: int = 2, after_s: float = 1.5):
    """Run the drill in-process; SIGKILL the server `after_s` into ramp step `kill_at_step` (from 1)."""
    from vramlab.drill.kind import DrillKind
    from vramlab.drill.local_targets import ProcessTarget
    from vramlab.drill.plan import parse_plan
    from vramlab.drill.start import run_drill_kind

    store = open_store(str(tmp_path / "s.db"))
    runner = DrillKind(parse_plan(doc), store, workdir=str(tmp_path / "work"))
    killed: list[tuple[float, int]] = []

    def kill() -> None:
        target = runner.target
        assert isinstance(target, ProcessTarget) and target._proc is not None
        pid = target._proc.pid
        os.kill(pid, signal.SIGKILL)
        killed.append((runner.run.now(), pid))

    def on_event(ev) -> None:
        if ev.kind == "step" and ev.data.get("step") == kill_at_step and not killed:
            asyncio.get_running_loop().call_later(after_s, kill)

    t = time.monotonic()
    result = asyncio.run(asyncio.wait_for(run_drill_kind(runner, store, subscribers=[on_event]), 200))
    return store, runner, result, killed, time.monotonic() - t


def test_drill_sigkill_is_a_crash_not_oom_and_a_slow_restart_is_not_killed(engine, tmp_path):
    py, model = engine
    # every start loads slowly (6 s before the engine even starts): longer than the default 5 s grace
    cmd = "sleep 6; " + lc.server_command(py, model, "{port}", extra="--model_alias tiny")
    doc = _drill_doc(py, model, tmp_path, cmd)
    store, runner, result, killed, took = _drill_with_kill(doc, tmp_path)
    rid = runner.run_id
    events = store.events(rid)
    inc = analyse(store.requests(rid), store.samples(rid), events, p95_tolerance=20)
    print(
        f"drill took {took:.1f} s; load time {runner.lifecycle.load_time_s:.2f} s; mode {inc.failure_mode}; "
        f"evidence {inc.evidence}; trigger {inc.trigger}; storm {inc.retry_storm}; recovery {inc.recovery}"
    )
    assert killed, "the ramp never reached the step where the server is killed"
    assert result.status == "completed" and result.failed_rounds == [0]
    # named from evidence: a kill by signal, no OOM anywhere
    assert inc.failure_mode == "killed_by_signal", inc.evidence
    assert any("killed by signal 9 (SIGKILL)" in e for e in inc.evidence)
    assert any("no out-of-memory evidence" in e for e in inc.evidence)
    assert not any(e.kind == "oom" for e in events)
    # T0 is the kill (its first evidence), never before it; the trigger sent requests
    assert inc.t0_s is not None and inc.t0_s >= killed[0][0] - 0.05
    assert inc.trigger is not None and inc.trigger.step == 2 and inc.trigger.requests_sent > 0
    # the server had no /health: discovery said so and used /v1/models
    hp = next(e for e in events if e.kind == "health_path")
    assert hp.data["path"] == "/v1/models" and "HTTP 404" in hp.message
    # the restart takes longer than the default grace, and the supervisor let it load
    restarts = [e for e in events if e.kind == "mitigation"]
    assert len(restarts) == 1 and "process exited" in restarts[0].message, [e.message for e in restarts]
    assert runner.lifecycle.load_time_s is not None and runner.lifecycle.load_time_s > 5.0
    assert inc.recovery.recovered, inc.recovery
    assert inc.recovery.first_success_s is not None and inc.recovery.first_success_s > 5.0
    # policy none: no retries, so no retry storm, whatever the closed-loop users did
    assert inc.retry_storm.retries == 0 and not inc.retry_storm.storm
    from vramlab.report import load_context, render

    md = render(load_context(store, rid), "md")
    assert "killed_by_signal" in md and "crash_after_oom" not in md and "| retry storm | no |" in md
    # the drill measured the process it started (its RSS, across the restart), beside the log's buffers
    rss = [s for s in store.samples(rid) if s.name == "host.target_rss_bytes"]
    assert len({s.labels["pid"] for s in rss}) == 2, {
        s.labels["pid"] for s in rss
    }  # before and after the kill
    peak = re.search(r"\| round 0 baseline \| peak \| – \| ([\d.]+)(?: MiB)? \|", md)
    assert peak and float(peak.group(1)) > 0, md[md.find("Plan against") :][:1500]
    assert "host memory: the target process's RSS" in md and "no capacity plan to compare with" in md


def test_drill_refused_restart_is_named_with_the_engines_words(engine, tmp_path):
    py, model = engine
    mark = tmp_path / "started-once"
    good = lc.server_command(py, model, "{port}", extra="--model_alias tiny")
    bad = lc.server_command(py, model, "{port}", extra="--no_such_flag 1")
    cmd = f"if [ -e {mark} ]; then {bad}; fi; touch {mark}; {good}"
    doc = _drill_doc(py, model, tmp_path, cmd, recovery={"limit_s": 15, "observe_s": 1})
    store, runner, result, killed, took = _drill_with_kill(doc, tmp_path, kill_at_step=1)
    rid = runner.run_id
    events = store.events(rid)
    inc = analyse(store.requests(rid), store.samples(rid), events, p95_tolerance=20)
    print(f"drill took {took:.1f} s; mode {inc.failure_mode}; evidence {inc.evidence}")
    assert killed
    assert inc.failure_mode == "killed_by_signal+startup_refusal_on_restart", inc.evidence
    refused = next(e for e in inc.evidence if e.startswith("restart refused"))
    assert "exited with code 2" in refused
    assert "unrecognized arguments: --no_such_flag" in refused  # the engine's own words, quoted
    assert not inc.recovery.recovered and any(e.kind == "not_recovered" for e in events)
    assert any(e.kind == "rollback" and "stop the target" in e.message for e in events)


def test_run_against_a_hung_engine_ends_non_zero_and_says_so(engine, tmp_path):
    # the server hangs mid-run (SIGSTOP: its socket still accepts connections, nothing answers)
    py, model = engine
    srv = lc.start_server(py, model, tmp_path / "server.log", extra="--model_alias tiny")
    plan = _run_plan(srv.url, duration_s=3.0, timeout_s=1.0)
    plan["stop_conditions"] = {"error_rate": 0.5, "window_s": 2, "min_requests": 5}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramlab", "run", "plan.yaml", "--db", str(tmp_path / "v.db")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    hung = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # progress lines, one per phase as it ends
            if "baseline:" in line:  # the baseline window ended: the treatment begins
                os.kill(srv.proc.pid, signal.SIGSTOP)
                hung = True
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.kill(srv.proc.pid, signal.SIGCONT)
        srv.stop()
    assert hung, ("the run never reached its treatment phase", out[-1500:], err[-1500:])
    print(out[-600:])
    assert proc.returncode == 3, (out[-2000:], err[-2000:])  # stopped by a stop condition
    assert "timed out" in out + err
    from vramlab.report import load_context, render

    store = open_store(str(tmp_path / "v.db"))
    (run,) = store.list_runs()
    md = render(load_context(store, run.run_id), "md")
    assert run.status == "stopped" and "timed out" in md
    returned = [ln for ln in md.splitlines() if "Returned to baseline:" in ln]
    assert all(" yes" not in ln for ln in returned), returned


def _drill_cli(tmp_path: Path, doc: dict, on_line, timeout: float = 170):
    """`vramlab drill` as a subprocess; `on_line(line)` sees each progress line on stderr until it returns True."""
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramlab",
            "drill",
            "plan.yaml",
            "--db",
            str(tmp_path / "v.db"),
            "-o",
            "incident.md",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if on_line(line):
                break
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, "".join(seen) + err


# a request timeout shorter than the step (its requests time out inside it) and longer (they are still in
# flight when the step's time is up: they end as timeouts all the same, never "cancelled" by the step's end)
@pytest.mark.parametrize("timeout_s", [2, 6])
def test_drill_recovers_a_sigstopped_engine_by_sigkill_and_restart_within_the_limit(
    engine, tmp_path, timeout_s
):
    # the server is SIGSTOPped mid-ramp: its socket still accepts, nothing answers, the process lives.
    # The supervisor sees health fail, and a stopped process never acts on SIGTERM: SIGKILL at once, restart.
    py, model = engine
    pidfile = tmp_path / "server.pid"
    cmd = f"echo $$ > {pidfile}; " + lc.server_command(py, model, "{port}", extra="--model_alias tiny")
    limit_s = 40
    doc = _drill_doc(
        py,
        model,
        tmp_path,
        cmd,
        load={"request_timeout_s": timeout_s},
        recovery={"limit_s": limit_s, "observe_s": 2, "liveness_grace_s": 2, "p95_tolerance": 50},
    )
    stopped: list[int] = []

    def hang(line: str) -> bool:
        if "concurrency = 4" in line and not stopped:
            time.sleep(1.0)
            stopped.append(int(pidfile.read_text()))
            os.kill(stopped[0], signal.SIGSTOP)
            return True
        return False

    try:
        code, out, err = _drill_cli(tmp_path, doc, hang)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
    assert stopped, "the ramp never reached concurrency 4"
    print(err[-3000:])
    store = open_store(str(tmp_path / "v.db"))
    (run,) = store.list_runs()
    events = store.events(run.run_id)
    restarts = [e for e in events if e.kind == "mitigation"]
    assert len(restarts) >= 1 and "health failing" in restarts[0].message, [e.message for e in restarts]
    assert "SIGKILL at once" in restarts[0].message and "state T" in restarts[0].message, restarts[0].message
    inc = analyse(store.requests(run.run_id), store.samples(run.run_id), events, p95_tolerance=50)
    assert inc.failure_mode.startswith("hang"), (inc.failure_mode, inc.evidence)
    # the restart happened inside the limit and the target served again: credited, recovered, exit 0
    assert inc.time_to_mitigate_s is not None and inc.time_to_mitigate_s < limit_s
    assert inc.recovery.recovered and some(inc.recovery.time_to_recover_s) < limit_s, inc.recovery
    assert code == 0, (out[-2000:], err[-3000:])
    log = (tmp_path / "target.log").read_text(errors="replace")
    assert log.count("KV buffer size") >= 2 * 1, "the target log shows no second start-up"
    # the requests in flight at the hang timed out; none was "cancelled" by the move to recovery
    reqs = store.requests(run.run_id)
    assert not any(r.error_class == "cancelled" and r.phase == "ramp" for r in reqs)
    assert inc.impact.in_flight_lost > 0 and inc.impact.error_classes.get("timeout", 0) > 0
    # the failure is at the step where the hang began, and every request in flight at T0 is lost: it timed out,
    # or (when its own timeout had not yet run out) the supervisor's SIGKILL of the stopped process broke its stream
    fault = next(e for e in events if e.kind == "fault")
    assert fault.data["value"] == 4, fault.message
    t0 = some(inc.t0_s)
    at_t0 = [r for r in reqs if some(r.sent_s) <= t0 + 1e-9 and (r.end_s or 1e9) >= t0 - 1e-9 and not r.ok]
    classes = {r.error_class for r in at_t0}
    assert at_t0 and "timeout" in classes and classes <= {"timeout", "stream_broken"}, [
        (r.error_class, r.error) for r in at_t0
    ]
    assert inc.impact.in_flight_lost == len(at_t0)
    md = (tmp_path / "incident.md").read_text()
    assert "**Failure mode:** hang" in md and "NOT recovered" not in md
    assert "restart the target on exit" not in md  # the supervisor did restart it


def test_a_drill_not_recovered_exits_1_and_every_section_says_so(engine, tmp_path):
    # killed mid-ramp; its restart is refused (a bad flag): not recovered, and the exit code, the live
    # lines, the headline, the JSON, the lessons and the recovery table all say the same
    py, model = engine
    mark, pidfile = tmp_path / "started-once", tmp_path / "server.pid"
    good = lc.server_command(py, model, "{port}", extra="--model_alias tiny")
    bad = lc.server_command(py, model, "{port}", extra="--no_such_flag 1")
    cmd = f"echo $$ > {pidfile}; if [ -e {mark} ]; then {bad}; fi; touch {mark}; {good}"
    doc = _drill_doc(py, model, tmp_path, cmd, recovery={"limit_s": 10, "observe_s": 1})
    killed: list[int] = []

    def kill(line: str) -> bool:
        if "concurrency = 2" in line and " step " in line and not killed:
            time.sleep(1.5)
            killed.append(int(pidfile.read_text()))
            os.kill(killed[0], signal.SIGKILL)
            return True
        return False

    code, out, err = _drill_cli(tmp_path, doc, kill)
    assert killed, err[-2000:]
    assert code == 1, (out[-2000:], err[-3000:])
    assert "vramlab drill: NOT recovered: round 0:" in err and "exit 1" in err
    assert not re.search(r"\brecovered\s+serving again", err)  # no live line claimed a recovery
    store = open_store(str(tmp_path / "v.db"))
    (run,) = store.list_runs()
    from vramlab.report import load_context
    from vramlab.report.incident import incident_json

    ctx = load_context(store, run.run_id)
    doc_json = incident_json(ctx)
    assert doc_json["recovered"] is False and doc_json["headline"]["recovery"]["recovered"] is False
    md = (tmp_path / "incident.md").read_text()
    head = next(ln for ln in md.splitlines() if ln.startswith("- **"))
    assert "NOT recovered" in head, head
    assert "Not recovered:" in md and "**Not recovered**" in md  # the lessons and the recovery section
    assert "| time to recover |" in md and re.search(r"\| time to recover \|[^|]*\| – \|", md), md


def test_plan_host_split_matches_what_the_cpu_build_logs(engine, tmp_path):
    """A CPU build has no GPU device: llama.cpp keeps every layer, the output layer and the KV on the host
    whatever -ngl says ('layer 2 assigned to device CPU', 'CPU KV buffer'). The plan with -ngl 0 says the
    same split and buffer sizes."""
    py, model = engine
    script = f"""
import llama_cpp as L
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.n_gpu_layers = 99
m = L.llama_model_load_from_file({str(model)!r}.encode(), mp)
cp = L.llama_context_default_params()
cp.n_ctx = 512; cp.n_seq_max = 1; cp.n_batch = 64; cp.n_ubatch = 64; cp.n_threads = 1
assert L.llama_init_from_model(m, cp), "no context"
"""
    res = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=120)
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-3000:]
    # load_tensors logs each layer's device (the output layer is layer n_layer): all CPU on a CPU build
    assigned = re.findall(r"layer\s+(\d+) assigned to device (\w+)", text)
    assert len(assigned) == lc.N_LAYER + 1 and {dev for _, dev in assigned} == {"CPU"}, text[-3000:]
    mapped = re.search(r"CPU_Mapped model buffer size\s*=\s*([\d.]+) MiB", text)
    kv = re.search(r"llama_kv_cache\w*:\s+CPU KV buffer size\s*=\s*([\d.]+) MiB", text)
    assert mapped and kv, text[-3000:]
    plan = _vramlab(
        "plan",
        "--model",
        str(model),
        "--engine",
        "llama.cpp",
        "--ctx-size",
        "512",
        "--parallel",
        "1",
        "-ngl",
        "0",
        "--gpu-memory-gib",
        "8",
        "--json",
        cwd=tmp_path,
    )
    assert plan.returncode == 4, plan.stderr[-2000:]  # plan's verdict: it fits, part of it on the CPU
    doc = json.loads(plan.stdout)
    host, dev = doc["host"], doc["devices"][0]
    assert dev["layers"] == 0 and dev["model_buffer_bytes"] == 0 and dev["kv_buffer_bytes"] == 0
    assert host["layers"] == lc.N_LAYER and host["output_layer"]
    assert abs(host["kv_buffer_bytes"] - float(kv.group(1)) * 2**20) <= 0.005 * 2**20
    assert host["mapped_buffer_bytes"] == pytest.approx(float(mapped.group(1)) * 2**20, rel=0.02)


def test_a_drill_on_a_broken_baseline_stops_before_the_ramp_with_the_engines_words(engine, tmp_path):
    # every baseline prompt is longer than the engine's context: llama.cpp refuses each one (HTTP 400).
    # The drill must not ramp and then blame its first step; it stops, quotes the engine, and exits 3
    # (stopped early: the one exit policy of runs and drills).
    py, model = engine
    cmd = lc.server_command(py, model, "{port}", n_ctx=256, extra="--model_alias tiny")
    doc = _drill_doc(py, model, tmp_path, cmd, load={"prompt_tokens": 600, "request_timeout_s": 10})
    code, out, err = _drill_cli(tmp_path, doc, lambda line: False)
    print(err[-2000:])
    assert code == 3, (out[-2000:], err[-3000:])
    store = open_store(str(tmp_path / "v.db"))
    (run,) = store.list_runs()
    kinds = [e.kind for e in store.events(run.run_id)]
    assert "step" not in kinds and "fault" not in kinds and "ceiling" not in kinds, kinds
    reqs = store.requests(run.run_id)
    assert reqs and all(not r.ok for r in reqs) and {r.phase for r in reqs} == {"baseline"}
    md = (tmp_path / "incident.md").read_text()
    assert "baseline broken" in md and "context window" in md, md[:2000]
