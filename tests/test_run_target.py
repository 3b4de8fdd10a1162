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
