"""Refusals that say what to do: compare names the plan fields that differ; alerts on a plan without an alerts:
section says so (it once told the user to run the plan)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from vramlab.analysis.compare import fixed_differences

ROOT = Path(__file__).resolve().parents[1]


def _run(plan: dict, plan_hash: str, kind: str = "experiment") -> SimpleNamespace:
    fixed = {"engine": "vllm", "engine_version": "0.8.5", "model": "m", "gpu_name": "H100"}
    return SimpleNamespace(run=SimpleNamespace(plan=plan, plan_hash=plan_hash, kind=kind, fixed=fixed))


def test_compare_names_the_plan_fields_that_differ() -> None:
    base = {
        "name": "a",
        "fixed": {"input": {"synthetic": {"prompt_tokens": 512, "seed": 3}}},
        "load": {"concurrency": 4},
        "target": {"model": "m", "base_url": "http://127.0.0.1:1/v1"},
    }
    other = {
        **base,
        "name": "b",  # not hashed: not a difference
        "fixed": {"input": {"synthetic": {"prompt_tokens": 1024, "seed": 3}}},
        "target": {"model": "m", "base_url": "http://127.0.0.1:2/v1"},  # the URL is not hashed either
    }
    (why,) = fixed_differences(_run(base, "a" * 64), _run(other, "b" * 64))  # type: ignore[arg-type]
    assert why == "plan_hash aaaaaaaaaaaa vs bbbbbbbbbbbb: fixed.input.synthetic.prompt_tokens 512 vs 1024"
    many = {**base, "load": {"concurrency": 8, "workers": 2, "retries": 1, "timeout": 3, "x": 4}}
    (why,) = fixed_differences(_run(base, "a" * 64), _run(many, "c" * 64))  # type: ignore[arg-type]
    assert why.count(" vs ") == 5 and why.endswith("and 1 more")
    assert fixed_differences(_run(base, "a" * 64), _run(base, "a" * 64)) == []  # type: ignore[arg-type]


def test_alerts_on_a_plan_without_alerts_says_so() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "alerts", str(ROOT / "examples" / "concurrency-ramp.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "has no alerts: section" in r.stderr and "run it with" not in r.stderr
