"""Where a run's target comes from: a plan can ask for its own sim (`target.sim`); a target nothing
answers at is refused before anything is stored; the hint after a run finds the run again (`--db`)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

import _synthetic_run as synth
from vramlab.cli.run import report_hint
from vramlab.errors import ConfigError
from vramlab.experiment.plan import parse_plan
from vramlab.store import open_store

ROOT = Path(__file__).resolve().parents[1]
PLAN = """
name: t
target: {TARGET}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 3, count: 4}}}}}}
change: {{variable: concurrency, steps: [2]}}
phases: {{duration_s: 1}}
rounds: 1
samplers: {{sources: [host]}}
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when we return: nothing listens there


def test_a_plan_names_an_endpoint_or_asks_for_a_sim():
    own = parse_plan(
        PLAN.format(TARGET="{kind: sim, model: qwen2.5-0.5b-instruct, sim: {gpu: l4, speed: 50}}")
    )
    assert own.target.base_url is None and own.target.sim is not None
    assert own.target.sim.argv()[:4] == ["--model", "qwen2.5-0.5b-instruct", "--gpu", "l4"]
    with pytest.raises(ConfigError, match="give base_url"):
        parse_plan(PLAN.format(TARGET="{model: m}"))
    with pytest.raises(ConfigError, match="need kind: sim"):
        parse_plan(PLAN.format(TARGET="{kind: vllm, model: m, sim: {gpu: l4}}"))
    with pytest.raises(ValueError, match="not known yet"):
        _ = own.target.url


def test_an_unreachable_target_is_refused_before_anything_is_stored(tmp_path):
    db = tmp_path / "v.db"
    with open_store(str(db)) as store:
        synth.insert(store)
        before = [r.run_id for r in store.list_runs()]
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN.format(TARGET=f"{{base_url: 'http://127.0.0.1:{_closed_port()}/v1', model: m}}"))
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "run", str(plan), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not reachable" in lines[0] and "nothing was stored" in lines[0], r.stderr
    assert "target: {kind: sim" in lines[0]  # says how to get a target without another terminal
    with open_store(str(db)) as store:
        assert [x.run_id for x in store.list_runs()] == before
    fresh = tmp_path / "fresh.db"
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "run", str(plan), "--db", str(fresh)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and not fresh.exists()


def test_the_render_hint_carries_the_store_it_used(monkeypatch):
    monkeypatch.delenv("VRAMLAB_DB", raising=False)
    assert (
        report_hint("7f3a91bc", None, "sqlite:///vramlab.db")
        == "vramlab report 7f3a91bc --format html -o report.html"
    )
    pg = "postgresql://vramlab:s3cret@db.internal:5432/vramlab"
    hint = report_hint("7f3a91bc", pg, pg)
    # quoted for the shell (the *** would glob); the password never shows
    assert hint.endswith("--db 'postgresql://vramlab:***@db.internal:5432/vramlab'") and "s3cret" not in hint
    monkeypatch.setenv("VRAMLAB_DB", pg)  # from the environment: said too, so the line works in another shell
    assert "--db 'postgresql://vramlab:***@" in report_hint("7f3a91bc", None, pg)
    assert report_hint("ab", "x.db", "sqlite:////tmp/x.db", "incident.html").endswith(
        "-o incident.html --db sqlite:////tmp/x.db"
    )


SIM = {
    "model": "qwen2.5-1.5b-instruct",
    "gpu": "l4",
    "engine": "vllm",
    "max_model_len": 4096,
    "extra_args": ["--engine-version", "0.6.3", "--kv-cache-dtype", "fp8"],
}


def test_a_runs_sim_settings_reach_its_capacity_plan_as_a_drills_do(tmp_path):
    """One reading of target.sim for both kinds: the engine flags among extra_args (the release
    the sim plays, its KV dtype) are in an experiment's capacity plan exactly as in a drill's."""
    from dataclasses import replace

    import yaml

    from vramlab.drill.kind import DrillKind
    from vramlab.drill.plan import parse_plan as parse_drill
    from vramlab.experiment.kind import ExperimentKind
    from vramlab.records.memory import MemoryStore
    from vramlab.run.capacity_plan import start_events

    flow = (
        "{kind: sim, model: qwen2.5-1.5b-instruct, sim: "
        + yaml.safe_dump(SIM, default_flow_style=True).strip()
        + "}"
    )
    experiment = ExperimentKind(parse_plan(PLAN.format(TARGET=flow))).capacity_facts()
    drill_doc = {
        "name": "d",
        "target": {"kind": "sim", "environment": "test", "sim": SIM},
        "ramp": {"knob": "concurrency", "start": 1, "factor": 2, "ceiling": 4},
    }
    drill = DrillKind(parse_drill(drill_doc), MemoryStore(), workdir=str(tmp_path)).capacity_facts()
    assert experiment == replace(drill, log_file=experiment.log_file)
    assert experiment.engine_version == "0.6.3" and experiment.settings == {
        "max_model_len": 4096,
        "kv_cache_dtype": "fp8",
    }
    (plan,) = [d.data for d in start_events(experiment) if d.kind == "capacity_plan"]
    assert plan["estimate"]["engine_version"] == "0.6.3" and plan["facts"]["engine_version"] == "0.6.3"


@pytest.mark.parametrize("command", ["run", "drill"])
def test_a_sim_engine_the_sim_does_not_play_is_refused_at_validation(tmp_path, command):
    """target.sim.engine is checked against the engine registry's sim engines: one line, exit 2,
    before anything starts or is stored."""
    if command == "run":
        text = PLAN.format(TARGET="{kind: sim, model: m, sim: {gpu: l4, engine: ollama}}")
    else:
        text = (
            "name: d\ntarget: {kind: sim, environment: test, sim: {gpu: l4, engine: ollama}}\n"
            "ramp: {knob: concurrency, start: 1, factor: 2, ceiling: 4}\n"
        )
    (tmp_path / "p.yaml").write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", command, "p.yaml", "--db", str(tmp_path / "v.db")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "target.sim.engine" in r.stderr and "'llama.cpp'" in r.stderr, r.stderr
    assert not (tmp_path / "v.db").exists()


@pytest.mark.slow
def test_a_runs_own_sim_plays_the_release_its_plan_is_made_for(tmp_path):
    """`vramlab run` with target.sim: the sim it starts plays --engine-version 0.6.3, and the
    capacity plan stored with the run is made for 0.6.3 (not the policy's newest release)."""
    text = PLAN.format(
        TARGET="{kind: sim, model: qwen2.5-1.5b-instruct, sim: {gpu: l4, max_model_len: 4096, "
        "extra_args: ['--engine-version', '0.6.3']}}"
    )
    (tmp_path / "p.yaml").write_text(text)
    db = tmp_path / "v.db"
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "run", "p.yaml", "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    with open_store(str(db)) as store:
        (run,) = store.list_runs()
        events = store.events(run.run_id)
    (plan,) = [e for e in events if e.kind == "capacity_plan"]
    assert plan.data["estimate"]["engine_version"] == "0.6.3", plan.data["estimate"]["engine_version"]
    (startup,) = [e for e in events if e.kind == "startup_memory"]  # the sim's own start-up log, read back
    assert startup.data["observation"]["engine"] == "vllm"
