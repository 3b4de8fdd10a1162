"""`change.search`: the largest concurrency or rate that still meets every SLO (bracketing, then
bisection, saturation when the throughput stops rising), each probe stored as a `search_probe`
event, the answer with its bracket and SLO in the report's JSON, goodput in every window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from vramlab.analysis.slo_search import Probe, SloSearch, probe
from vramlab.analysis.stats import Slo, summarize_requests
from vramlab.experiment.plan import Change
from vramlab.records import RequestRecord

VRAMLAB = str(Path(sys.executable).with_name("vramlab"))


def _records(n: int, duration_s: float, ttft_ms: float, output_tokens: int = 10) -> list[RequestRecord]:
    """n successful requests spread evenly over duration_s."""
    gap = duration_s / n
    return [
        RequestRecord(
            run_id="r",
            round=1,
            phase="treatment",
            step=1,
            request_id=str(i),
            scheduled_s=i * gap,
            sent_s=i * gap,
            end_s=(i + 1) * gap,
            ttft_ms=ttft_ms,
            e2e_ms=gap * 1000,
            status_code=200,
            output_tokens=output_tokens,
        )
        for i in range(n)
    ]


def _walk(search: SloSearch, knee: float) -> float | None:
    """Drive the search against a target that meets the SLO up to *knee* and return its answer."""
    value: float | None = search.first()
    while value is not None:
        good = value <= knee
        p = Probe(
            value, 100, 4.0, 25.0, {"p95_ttft_ms": 50.0 if good else 500.0}, () if good else ("p95_ttft_ms",)
        )
        value = search.next(p)
    return search.answer


@settings(max_examples=200, deadline=None)
@given(knee=st.integers(1, 199), low=st.integers(1, 8), high=st.integers(200, 400))
def test_a_search_answers_the_knee_exactly_in_few_probes(knee, low, high):
    s = SloSearch(float(low), float(high), integer=True, max_probes=32)
    got = _walk(s, float(knee))
    if knee < low:
        assert got is None and s.bracket == (None, float(low))
    else:
        assert got == knee and s.bracket == (float(knee), float(knee + 1))
    assert len(s.probes) <= 2 * 9 + 2  # doubling, then halving: logarithmic in high / low


def test_a_search_that_meets_the_slo_up_to_high_says_so():
    s = SloSearch(2.0, 50.0, integer=True)
    assert _walk(s, 1000.0) == 50.0 and s.bracket == (50.0, None) and "up to high" in s.reason
    rate = SloSearch(1.0, 100.0, integer=False)
    got = _walk(rate, 37.0)
    assert got is not None and 37.0 * 0.95 <= got <= 37.0  # a rate: within 5 % of the bracket's bottom


def test_saturation_fails_a_probe_whose_throughput_stopped_rising():
    slo = {"p95_ttft_ms": 1000.0}
    eight = probe(8, _records(320, 4.0, 50.0), slo, 10)  # 80 requests/s: 10 per user
    assert eight.meets and eight.throughput_rps == pytest.approx(80.0)
    flat = probe(16, _records(330, 4.0, 50.0), slo, 10, eight, best_per_user=10.0)
    assert flat.failed == ("saturated",)  # twice the users, +3 % throughput
    rising = probe(16, _records(600, 4.0, 50.0), slo, 10, eight, best_per_user=10.0)
    assert rising.meets
    # an open loop offered 100 requests/s and completing 50: past saturation
    assert probe(100, _records(200, 4.0, 50.0), slo, 10, open_loop=True).failed == ("saturated",)
    assert probe(10, _records(8, 4.0, 50.0), slo, 10).failed == ("too_few_requests",)
    assert probe(10, _records(40, 4.0, 500.0), slo | {"p95_ttft_ms": 100.0}, 10).failed == ("p95_ttft_ms",)


def test_a_probe_whose_halves_disagree_is_probed_again_once():
    first, second = _records(20, 2.0, 50.0), _records(20, 2.0, 400.0)
    for r in second:
        r.end_s = (r.end_s or 0) + 2.0  # the window's second half: a stall
    p = probe(4, first + second, {"p95_ttft_ms": 100.0}, 10)
    assert p.unstable and not p.meets
    s = SloSearch(4, 64, integer=True)
    s.first()
    assert s.next(p) == 4  # once more at the same value
    assert s.next(p) is None and s.reason == "the lowest value already breaks the SLO"


def test_the_plan_takes_a_search_by_its_variable_and_refuses_what_it_cannot_search():
    c = Change.model_validate(
        {"search": {"variable": "rate", "low": 1, "high": 8, "slo": {"p95_ttft_ms": 200, "error_rate": 0.01}}}
    )
    assert c.variable == "request_rate" and c.values() == [1, 8]
    for bad in (
        {"search": {"variable": "concurrency", "low": 1, "high": 8, "slo": {"p97_ttft_ms": 1}}},
        {"search": {"variable": "concurrency", "low": 8, "high": 1, "slo": {"error_rate": 0.1}}},
        {"variable": "max_tokens", "search": {"low": 1, "high": 8, "slo": {"error_rate": 0.1}}},
        {
            "variable": "concurrency",
            "steps": [1],
            "search": {"low": 1, "high": 8, "slo": {"error_rate": 0.1}},
        },
    ):
        with pytest.raises(ValidationError):
            Change.model_validate(bad)


def test_goodput_counts_the_requests_and_tokens_inside_the_slo():
    recs = _records(10, 2.0, 50.0, output_tokens=4) + _records(10, 2.0, 500.0, output_tokens=4)
    s = summarize_requests(recs, 2.0, Slo(ttft_ms=100.0))
    assert s.goodput_rps == pytest.approx(5.0) and s.goodput_tok_s == pytest.approx(20.0)
    assert summarize_requests(recs, 2.0).goodput_tok_s is None  # no SLO: no goodput


# The rehearsal server admits max_num_seqs = 8 sequences (vLLM's scheduler); a ninth user waits a whole
# request in its queue, so the P95 time to first token breaks there: the saturation point is 8.
PLAN = """kind: experiment
name: slo-search
target:
  kind: sim
  model: qwen2.5-1.5b-instruct
  sim: {gpu: l4, engine: vllm, speed: 1, max_model_len: 4096, max_num_seqs: 8, seed: 7}
fixed:
  input: {synthetic: {prompt_tokens: 256, output_tokens: 16, seed: 7, count: 50}}
  ignore_eos: true
change:
  variable: concurrency
  baseline: 1
  search: {low: 3, high: 24, slo: {p95_ttft_ms: 100, error_rate: 0.01}, min_requests: 10}
phases: {duration_s: 4, drain_s: 2}
rounds: 1
load: {mode: closed, concurrency: 1}
samplers: {interval_s: 0.5, sources: [engine, health]}
"""


@pytest.mark.slow
def test_a_search_on_the_rehearsal_server_finds_its_saturation_point(tmp_path):
    db = str(tmp_path / "v.db")
    (tmp_path / "plan.yaml").write_text(PLAN)
    r = subprocess.run(
        [VRAMLAB, "run", str(tmp_path / "plan.yaml"), "--db", db, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    run_id = json.loads(r.stdout)["run_id"]
    rep = subprocess.run(
        [VRAMLAB, "report", run_id, "--db", db, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    [search] = report["search"]
    assert search["answer"] is not None and abs(search["answer"] - 8) <= 1, search
    assert search["bracket"][0] == search["answer"] and search["bracket"][1] > search["answer"]
    assert search["slo"] == {"p95_ttft_ms": 100.0, "error_rate": 0.01}
    # every probe is stored, one per treatment window, in the order probed
    probes = search["probes"]
    steps = [w for w in report["steps"] if w["phase"] == "treatment"]
    assert [p["value"] for p in probes] == [w["step_value"] for w in steps]
    assert [p["value"] for p in probes][:3] == [3, 6, 12]  # doubling from low
    assert all(p["meets"] == (p["value"] <= search["answer"]) for p in probes)
    # goodput, by the search's SLO, in every window
    for w in steps:
        assert w["requests"]["goodput_rps"] is not None and w["requests"]["goodput_tok_s"] is not None
    md = subprocess.run(
        [VRAMLAB, "report", run_id, "--db", db, "--format", "md"], capture_output=True, text=True, timeout=120
    )
    assert (
        md.returncode == 0
        and f"meeting p95_ttft_ms <= 100, error_rate <= 0.01 is {search['answer']:g}" in md.stdout
    )
