"""benchmarks/accuracy.py on the development split: the targets of issue 2, and better than the baselines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="module")
def summary():
    if not (DATA / "observed_memory.jsonl").exists():
        pytest.skip(f"no measurements at {DATA}")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy.py"), "--data", str(DATA), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_meets_the_issue_targets(summary):
    ours = summary["summary"]["vramlab"]
    assert ours["weights"]["median"] <= 2.0
    assert ours["kv_cache_gib"]["median"] <= 3.0
    assert ours["kv_cache_gib"]["p90"] <= 8.0
    assert ours["max_concurrency"]["median"] <= 3.0


def test_beats_both_baselines_on_kv_and_concurrency(summary):
    s = summary["summary"]
    for metric in ("kv_cache_gib", "max_concurrency"):
        for base in ("naive", "weights+kv"):
            assert s["vramlab"][metric]["p90"] < s[base][metric]["p90"]
            assert s["vramlab"][metric]["median"] < s[base][metric]["median"]


def test_rows_are_not_silently_dropped(summary):
    scored = {r["row"] for r in summary["rows"]}
    skipped = {rid for rid, _ in summary["skipped"]}
    total = sum(1 for line in (DATA / "observed_memory.jsonl").read_text().splitlines() if line.strip())
    assert len(scored) + len(skipped) == total
    assert len(skipped) <= total * 0.1
