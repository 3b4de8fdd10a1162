"""One exit-code policy for `vramlab run` and `vramlab drill` (vramlab.run.runner.exit_code,
docs/experiments.md "Exit codes"): the same status ends both commands with the same code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vramlab.errors import ConfigError, VramlabError
from vramlab.run.runner import exit_code
from vramlab.store import open_store

VRAMLAB = str(Path(sys.executable).parent / "vramlab")  # the installed command


@pytest.mark.parametrize(
    ("status", "error", "recovered", "code"),
    [
        ("completed", None, True, 0),
        ("completed", None, False, 1),  # a drill whose failed target did not recover
        ("stopped", None, True, 3),
        ("interrupted", None, True, 130),
        ("failed", None, True, 1),  # the store gave up
        ("failed", ConfigError("bad"), True, 2),  # bad input found once the run started
        ("failed", type("Crash", (VramlabError,), {"exit_code": 1})("x"), True, 1),
        ("failed", ValueError("a bug"), True, 70),
    ],
)
def test_the_policy(status: str, error: BaseException | None, recovered: bool, code: int) -> None:
    assert exit_code(status, error, recovered) == code


def _vramlab(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VRAMLAB, *args, "--db", str(tmp_path / "v.db")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def _stored(tmp_path: Path) -> str:
    with open_store(str(tmp_path / "v.db")) as store:
        (run,) = store.list_runs()
        return run.status


@pytest.mark.slow
def test_a_stopped_run_and_a_stopped_drill_exit_3(tmp_path: Path) -> None:
    """Both broken from their baseline on (the sim serves another model than the requests name:
    every request is refused): the run stops by its error-rate stop condition, the drill before
    its ramp; both say why and exit 3."""
    sim = {"gpu": "l4", "model": "qwen2.5-0.5b-instruct", "speed": 50}
    run = {
        "name": "broken",
        "target": {"kind": "sim", "model": "not-served", "sim": sim},
        "fixed": {"input": {"synthetic": {"prompt_tokens": 8, "output_tokens": 2, "count": 4}}},
        "change": {"variable": "concurrency", "steps": [2]},
        "phases": {"duration_s": 1},
        "rounds": 1,
        "stop_conditions": {"min_requests": 2},
        "samplers": {"sources": ["host"]},
    }
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "p.yaml").write_text(yaml.safe_dump(run))
    r = _vramlab(tmp_path / "run", "run", "p.yaml")
    assert r.returncode == 3, (r.stdout[-1000:], r.stderr[-2000:])
    assert "stopped" in r.stdout and "does not exist" in r.stdout and _stored(tmp_path / "run") == "stopped"
    drill = {
        "name": "broken",
        "target": {"kind": "sim", "environment": "test", "model": "not-served", "sim": sim},
        "baseline_s": 1.0,
        "ramp": {"knob": "concurrency", "start": 1, "factor": 2, "ceiling": 2, "step_s": 1},
    }
    (tmp_path / "drill").mkdir()
    (tmp_path / "drill" / "d.yaml").write_text(yaml.safe_dump(drill))
    r = _vramlab(tmp_path / "drill", "drill", "d.yaml", "-q")
    assert r.returncode == 3, (r.stdout[-1000:], r.stderr[-2000:])
    assert "baseline broken, nothing ramped" in r.stdout and _stored(tmp_path / "drill") == "stopped"
