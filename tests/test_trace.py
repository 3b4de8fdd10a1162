"""Request traces: Mooncake's JSONL, BurstGPT's CSV and vramlab's own JSONL read as their projects
publish them, replayed at their own times with prompts of their lengths in the target's tokens,
equal hash_ids giving equal prefixes; the bundled samples are what scripts/make-trace-samples makes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlab.errors import ConfigError
from vramlab.load.prompts import Prompt, PromptMaker
from vramlab.load.trace import MOONCAKE_BLOCK_TOKENS, mean_rate, parse_trace, read_trace, trace_prompts

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
VRAMLAB = str(Path(sys.executable).with_name("vramlab"))


class Pieces:
    """A tokenizer whose words cost one token per started 3 letters, plus a BOS."""

    def __init__(self) -> None:
        self.calls = 0

    async def count(self, text: str) -> int:
        self.calls += 1
        return 1 + sum(-(-len(p) // 3) for p in re.findall(r"\w+|[^\w\s]", text))


def test_mooncake_lines_as_published():
    text = (
        '{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}\n'
        '{"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]}\n'
        '{"timestamp": 27482, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}\n'
    )
    tr = parse_trace(text, "mooncake")
    assert [r.t_s for r in tr] == [0.0, 10.535, 27.482]
    assert tr[1].input_tokens == 672 and tr[1].output_tokens == 26 and tr[1].hash_ids == (46, 47)
    half = parse_trace(text, "mooncake", time_scale=0.5, max_requests=2)
    assert [r.t_s for r in half] == [0.0, 10.535 / 2]


def test_burstgpt_csv_as_published():
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,API log\n"  # a failed request in BurstGPT_1.csv: 0 response tokens
        "12,GPT-4,300,40,340,Conversation log\n"
    )
    tr = parse_trace(text, "burstgpt")
    assert [(r.t_s, r.model, r.input_tokens, r.output_tokens) for r in tr] == [
        (0.0, "ChatGPT", 472, 18),
        (7.0, "GPT-4", 300, 40),  # sorted by time, relative to the first
        (40.0, "ChatGPT", 1087, 1),  # replayed as one token
    ]
    assert all(r.hash_ids == () for r in tr)


def test_vramlabs_own_jsonl_is_the_pack_trace():
    tr = read_trace(EX / "trace.jsonl", "jsonl")
    assert tr[0].t_s == 0 and tr[0].model == "rag" and tr[0].input_tokens == 6351


@pytest.mark.parametrize(
    ("fmt", "text", "says"),
    [
        ("mooncake", '{"timestamp": 0, "input_length": 0, "output_length": 1}', "input_length"),
        ("mooncake", '{"timestamp": -5, "input_length": 10, "output_length": 1}', "timestamp"),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2, 3]}',
            "hash_ids",
        ),
        ("mooncake", "[1, 2]", "JSON object"),
        ("mooncake", "{nope", "not JSON"),
        ("burstgpt", "Time,Tokens\n1,2\n", "not a BurstGPT header"),
        ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\nx,ChatGPT,1,2\n", "Timestamp"),
        ("jsonl", '{"t_s": 0, "prompt_tokens": 5, "output_tokens": 1, "prompt": ""}', "prompt"),
        ("jsonl", "", "no requests"),
    ],
)
def test_bad_traces_say_where(fmt, text, says):
    with pytest.raises(ConfigError, match=says):
        parse_trace(text, fmt, name="t.x")


def test_the_samples_are_what_the_script_makes():
    for fmt, name in (("mooncake", "mooncake-sample.jsonl"), ("burstgpt", "burstgpt-sample.csv")):
        made = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make-trace-samples"), "--print", fmt],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert (EX / name).read_text() == made
        assert len(read_trace(EX / name, fmt)) == 48  # type: ignore[arg-type]


def test_prompts_have_the_traces_lengths_and_share_what_their_ids_share():
    tr = read_trace(EX / "mooncake-sample.jsonl", "mooncake")
    counter = Pieces()
    prompts, note = asyncio.run(trace_prompts(tr, PromptMaker(counter, 7)))
    assert "in the target's tokens" in note
    for r, p in zip(tr, prompts, strict=True):
        assert p.prompt_tokens == asyncio.run(counter.count(p.text)) + 7 == r.input_tokens
        assert p.output_tokens == r.output_tokens and p.tokens_source == "tokenizer"
    by_ids: dict[tuple[int, ...], Prompt] = {}
    for r, p in zip(tr, prompts, strict=True):
        for other_ids, other in by_ids.items():
            common = len(os.path.commonprefix([r.hash_ids, other_ids]))
            shared = os.path.commonprefix([p.text, other.text])
            if common and len(r.hash_ids) > common and len(other_ids) > common:
                # their common full blocks are the same text: the engine sees common x 512 tokens alike
                assert asyncio.run(counter.count(shared)) + 7 >= common * MOONCAKE_BLOCK_TOKENS - 2
            if not common:
                assert len(shared) < 40  # a few letters by chance at most
        by_ids[r.hash_ids] = p


def test_without_a_tokenizer_the_lengths_are_an_estimate():
    tr = parse_trace('{"t_s": 0, "prompt_tokens": 300, "output_tokens": 4}', "jsonl")
    prompts, note = asyncio.run(trace_prompts(tr))
    assert prompts[0].tokens_source == "estimate" and prompts[0].prompt_tokens == 300
    assert len(prompts[0].text.split()) == 300 and "estimate" in note


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3000), st.lists(st.integers(0, 5), max_size=6)), min_size=1, max_size=6)
)
def test_any_trace_gets_its_exact_lengths(rows: list[tuple[int, list[int]]]) -> None:
    lines = [
        json.dumps(
            {"timestamp": i * 10, "input_length": n, "output_length": 3, "hash_ids": ids[: -(-n // 512)]}
        )
        for i, (n, ids) in enumerate(rows)
    ]
    tr = parse_trace("\n".join(lines), "mooncake")
    counter = Pieces()
    prompts, _ = asyncio.run(trace_prompts(tr, PromptMaker(counter, 3)))
    for r, p in zip(tr, prompts, strict=True):
        true = asyncio.run(counter.count(p.text)) + 3
        assert p.prompt_tokens == true  # the count it carries is the true one
        assert true == max(r.input_tokens, 3 + 1 + 1) or true == r.input_tokens


def test_a_request_rate_step_stretches_the_traces_gaps():
    from vramlab.experiment.plan import parse_plan
    from vramlab.experiment.wiring import trace_schedule

    tr = read_trace(EX / "mooncake-sample.jsonl", "mooncake")
    plan = parse_plan(
        "name: t\ntarget: {base_url: 'http://127.0.0.1:1', model: m}\n"
        "fixed: {input: {trace: x.jsonl, format: mooncake}}\n"
        "change: {variable: request_rate, baseline: 2, steps: [8]}\nphases: {duration_s: 1}\nload: {mode: open}\n"
    )
    times = trace_schedule(tr, plan, 8.0)
    rate = mean_rate(tr)
    assert rate is not None
    assert times[-1] == pytest.approx(tr[-1].t_s * rate / 8) and times[0] == 0
    assert (len(times) - 1) / times[-1] == pytest.approx(8.0)


@pytest.mark.parametrize(
    ("fixed", "load", "says"),
    [
        ("{input: {trace: x.jsonl}}", "{mode: open}", "needs format"),
        ("{input: {trace: x.jsonl, format: mooncake}}", "{mode: closed}", "load.mode: open"),
        (
            "{input: {synthetic: {prompt_tokens: 5, output_tokens: 5}, time_scale: 2}}",
            "{mode: closed}",
            "belong to a trace",
        ),
    ],
)
def test_plan_rules_for_a_trace(fixed, load, says):
    from vramlab.experiment.plan import parse_plan

    with pytest.raises(ConfigError, match=says):
        parse_plan(
            f"name: t\ntarget: {{base_url: 'http://127.0.0.1:1', model: m}}\nfixed: {fixed}\n"
            f"change: {{variable: concurrency, steps: [2]}}\nphases: {{duration_s: 1}}\nload: {load}\n"
        )


def test_a_bad_trace_is_refused_before_the_run(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": "many", "output_length": 1}\n')
    plan = (EX / "trace-replay.yaml").read_text().replace("mooncake-sample.jsonl", "t.jsonl")
    (tmp_path / "p.yaml").write_text(plan)
    r = subprocess.run(
        [VRAMLAB, "run", str(tmp_path / "p.yaml"), "--db", str(tmp_path / "v.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "t.jsonl:1: input_length" in r.stderr and "Traceback" not in r.stderr


def test_a_mooncake_trace_replays_at_its_times_and_lengths_and_shares_its_prefixes(tmp_path):
    """The sample against the rehearsal server: every request scheduled at the trace's own time, its
    prompt the trace's length as the server counts it, and the shared hash_ids served by its prefix
    cache (the server's own counters and its answers' cached_tokens)."""
    shutil.copy(EX / "mooncake-sample.jsonl", tmp_path)
    plan = (EX / "trace-replay.yaml").read_text()
    plan = plan.replace(
        "max_num_seqs: 32, seed: 7}",
        "max_num_seqs: 32, seed: 7, extra_args: [--enable-prompt-tokens-details]}",
    )
    plan = re.sub(r"time_scale: 1.0 .*", "time_scale: 0.5", plan)
    plan = plan.replace("steps: [7.2]", "steps: [7.2]\n  baseline: 7.2").replace("  baseline: 3.6 ", "  #")
    plan = plan.replace("duration_s: 14", "duration_s: 8").replace("drain_s: 5", "drain_s: 4")
    (tmp_path / "p.yaml").write_text(plan)
    r = subprocess.run(
        [VRAMLAB, "run", str(tmp_path / "p.yaml"), "--db", str(tmp_path / "v.db"), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    trace = read_trace(EX / "mooncake-sample.jsonl", "mooncake")
    rate = mean_rate(trace)
    assert rate is not None
    db = sqlite3.connect(tmp_path / "v.db")
    rows = db.execute(
        "SELECT phase, request_id, scheduled_s, sent_s, prompt_tokens, prompt_tokens_source, cached_tokens,"
        " error_class FROM requests WHERE run_id = ?",
        (out["run_id"],),
    ).fetchall()
    by_phase: dict[str, list[tuple]] = {}
    for row in rows:
        by_phase.setdefault(row[0], []).append(row)
    assert set(by_phase) == {"baseline", "treatment", "recovery"}
    for phase, got in by_phase.items():
        got.sort(key=lambda x: int(x[1].rsplit("-", 1)[1]))  # arrival k is request k of the window
        assert len(got) == len(trace), phase
        start = got[0][2]
        for row, req in zip(got, trace, strict=True):
            assert row[7] is None, row
            # at the trace's own time (its gaps stretched to the step's mean rate of 7.2/s)
            assert row[2] - start == pytest.approx(req.t_s * rate / 7.2, abs=1e-6)
            # the trace's length, as the server counted it in its usage
            assert row[5] == "usage" and row[4] == req.input_tokens
    # each sent at its time: the median of (sent - scheduled) within 20 ms (the client's lag on a
    # shared machine is a few ms; a replay that ignored the trace's times would be off by seconds)
    errors_s = sorted(row[3] - row[2] for row in rows)
    assert 0 <= errors_s[len(errors_s) // 2] <= 0.020, errors_s[len(errors_s) // 2]
    hits = [row[6] for row in rows]
    assert all(h is not None for h in hits) and sum(hits) > 0
    treatment = sorted(by_phase["treatment"], key=lambda x: int(x[1].rsplit("-", 1)[1]))
    for row, req in zip(treatment, trace, strict=True):
        if req.hash_ids and req.hash_ids[0] == 0:  # the shared system prompt, warm since the baseline
            # its full 16-token blocks, less the last few words a shorter prompt ends block 0 with
            assert row[6] >= min(MOONCAKE_BLOCK_TOKENS, req.input_tokens) - 48, (row, req)
    samples = dict(
        db.execute(
            "SELECT name, MAX(value) FROM samples WHERE run_id = ? AND name LIKE 'engine.prefix%' GROUP BY name",
            (out["run_id"],),
        ).fetchall()
    )
    assert samples["engine.prefix_cache_hits_total"] > 0
    assert samples["engine.prefix_cache_queries_total"] >= samples["engine.prefix_cache_hits_total"]
