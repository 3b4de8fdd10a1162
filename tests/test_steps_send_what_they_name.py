"""Every step sends what it names, for every knob of drills and runs, on the rehearsal server.

The stored requests are grouped by step: at least 95 % of each step's requests carry that step's
prompt (the engine's own count within 2 % of the step's length: the ramp's value for the context
knob, the plan's length for the others), the concurrency knob's steps have that many requests in
flight at once, and the batch knob's burst has that many requests. The shipped drill examples are
the plans, with shorter windows.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest
import yaml

from vramlab.drill.kind import DrillKind
from vramlab.drill.plan import parse_plan
from vramlab.drill.start import run_drill_kind
from vramlab.records import RequestRecord
from vramlab.store import open_store

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _example(name: str, tmp_path: Path, **ramp: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    doc["target"]["sim"]["device"] = str(tmp_path / "gpu0.ledger")
    doc["baseline_s"] = 1.0
    doc["ramp"] = {**doc["ramp"], "step_s": 0.8, **ramp}
    doc.setdefault("recovery", {})["observe_s"] = 0.5
    doc["stop_conditions"]["wall_clock_s"] = 45
    return doc


def _drill(doc: dict[str, Any], tmp_path: Path) -> tuple[list[RequestRecord], dict[str, Any]]:
    store = open_store(str(tmp_path / "s.db"))
    (tmp_path / "work").mkdir()
    runner = DrillKind(parse_plan(doc), store, workdir=str(tmp_path / "work"))
    asyncio.run(asyncio.wait_for(run_drill_kind(runner, store), 90))
    run = store.get_run(runner.run_id)
    return store.requests(runner.run_id), {"notes": run.notes, "events": store.events(runner.run_id)}


def carries(reqs: list[RequestRecord], tokens: float) -> float:
    """The share of *reqs* whose stored prompt tokens are within 2 % of *tokens*."""
    hit = [r for r in reqs if r.prompt_tokens is not None and abs(r.prompt_tokens - tokens) <= 0.02 * tokens]
    return len(hit) / len(reqs)


def by_step(reqs: list[RequestRecord], phase: str) -> dict[float, list[RequestRecord]]:
    out: dict[float, list[RequestRecord]] = collections.defaultdict(list)
    for r in reqs:
        if r.phase == phase and r.step_value is not None:
            out[r.step_value].append(r)
    return out


def in_flight_max(reqs: list[RequestRecord]) -> int:
    """The most requests open at one instant (sent, not yet ended)."""
    edges = sorted(
        [(r.sent_s, 1) for r in reqs if r.sent_s is not None and r.end_s is not None]
        + [(r.end_s, -1) for r in reqs if r.sent_s is not None and r.end_s is not None]
    )
    n = top = 0
    for _, d in edges:
        n += d
        top = max(top, n)
    return top


@pytest.mark.parametrize(
    ("example", "knob", "ramp"),
    [
        ("oom-drill.yaml", "context", {}),
        ("oom-drill.yaml", "concurrency", {"knob": "concurrency", "start": 2, "factor": 2, "ceiling": 8}),
        ("oom-drill.yaml", "batch", {"knob": "batch", "start": 4, "factor": 2, "ceiling": 16}),
        ("cotenant-drill.yaml", "balloon", {"ceiling": 2.0}),
        ("colocation-drill.yaml", "coloaded_model", {"ceiling": 2}),
    ],
)
@pytest.mark.timeout(150)
def test_each_drill_step_sends_its_own_prompt(tmp_path, example, knob, ramp):
    doc = _example(example, tmp_path, **ramp)
    if example == "oom-drill.yaml":  # the sim says what its prefix cache served in every answer
        doc["target"]["sim"]["extra_args"] = [
            *doc["target"]["sim"]["extra_args"],
            "--enable-prompt-tokens-details",
        ]
    reqs, run = _drill(doc, tmp_path)
    load = doc["load"]
    steps = by_step(reqs, "ramp")
    assert steps, "the ramp sent nothing"
    # the target counted the prompts itself (the sim answers vLLM's /tokenize)
    assert any("prompt tokens: counted with the engine's POST /tokenize" in n for n in run["notes"]), run[
        "notes"
    ]
    base = [r for r in reqs if r.phase == "baseline"]
    assert carries(base, load["prompt_tokens"]) >= 0.95
    for value, rs in steps.items():
        length = value if knob == "context" else load["prompt_tokens"]
        assert carries(rs, length) >= 0.95, (value, sorted({r.prompt_tokens or 0 for r in rs}))
        completed = [r for r in rs if r.error_class is None]
        if knob == "concurrency" and len(completed) == len(rs):
            assert in_flight_max(rs) == int(value), value  # that many users, no more, no fewer
        if knob == "batch":
            burst = [r for r in rs if r.request_id.startswith("burst:") and r.attempt == 0]
            assert len(burst) == int(value), (value, len(burst))
    if knob == "context":
        # every step up to the failure: the failing one is the first whose length the ramp names
        assert sorted(steps)[: len(steps)] == doc_values(doc)[: len(steps)]
    if example == "oom-drill.yaml":
        # SGLang's radix cache is on (the sim models it, a token a page, and says what it served): every
        # prompt is new, so the cache served a request at most the first tokens of its head (the same
        # digits in two heads: "#1003-0000-00000"), never a prompt sent before; a retry sends its own again
        assert "--disable-radix-cache" not in doc["target"]["sim"]["extra_args"]
        said = [r for r in reqs if r.cached_tokens is not None and r.attempt == 0]
        assert said and max(r.cached_tokens or 0 for r in said) <= 12, [
            (r.phase, r.request_id, r.prompt_tokens, r.cached_tokens)
            for r in said
            if (r.cached_tokens or 0) > 12
        ][:8]


def doc_values(doc: dict[str, Any]) -> list[float]:
    from vramlab.drill.ramp import ramp_values

    return [float(v) for v in ramp_values(parse_plan(doc).ramp)]


@pytest.mark.parametrize(
    ("example", "steps"),
    [("memory-context.yaml", [1024, 2048]), ("memory-concurrency.yaml", [4, 16])],
)
@pytest.mark.timeout(150)
def test_each_run_step_sends_its_own_prompt(tmp_path, example, steps):
    import json
    import os
    import subprocess
    import sys

    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["rounds"] = 1
    doc["change"]["steps"] = steps
    doc["phases"] = {"duration_s": 1.5, "drain_s": 1.0}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "run", "plan.yaml", "--db", str(tmp_path / "v.db"), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "VRAMLAB_DB": str(tmp_path / "v.db")},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    store = open_store(str(tmp_path / "v.db"))
    run_id = json.loads(res.stdout)["run_id"]
    reqs = [r for r in store.requests(run_id) if r.error_class != "cancelled"]
    syn = doc["fixed"]["input"]["synthetic"]
    variable = doc["change"]["variable"]
    for phase in ("baseline", "treatment", "recovery"):
        for value, rs in by_step(reqs, phase).items():
            length = value if variable == "prompt_tokens" else syn["prompt_tokens"]
            assert carries(rs, length) >= 0.95, (phase, value, sorted({r.prompt_tokens or 0 for r in rs}))
            assert {r.prompt_tokens_source for r in rs} == {"usage"}  # the engine's own count, stored
            if variable == "concurrency":
                assert in_flight_max(rs) == int(value), (phase, value)
