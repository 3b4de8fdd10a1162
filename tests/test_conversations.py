"""Conversations: N conversations x T turns with a shared system prompt and growing history, tool
pauses between turns, tenants with their own SLO; each turn stored with its conversation, turn and
tenant, and each tenant judged against its SLO in the report."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from vramlab.experiment.plan import InputSet
from vramlab.load.client import RequestResult
from vramlab.load.conversations import ConversationShape, conversation_prompts, tenant_of
from vramlab.load.driver import LoadShape, Window, drive
from vramlab.load.prompts import Prompt, cycle, synthetic_prompts

VRAMLAB = str(Path(sys.executable).with_name("vramlab"))


class _Echo:
    """Answers each request at once with a text naming it, and keeps what it was sent."""

    def __init__(self, fail_turn: int | None = None) -> None:
        self.sent: list[Prompt] = []
        self.fail_turn = fail_turn

    async def send(self, request_id, prompt, max_tokens, scheduled_at, attempt=0):
        self.sent.append(prompt)
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        bad = prompt.turn == self.fail_turn
        return RequestResult(
            request_id=request_id,
            attempt=attempt,
            scheduled_at=scheduled_at,
            sent_at=now,
            end_at=now,
            first_token_at=now,
            status_code=500 if bad else 200,
            error_class="http_5xx" if bad else None,
            output_tokens=1,
            conversation=prompt.conversation,
            turn=prompt.turn,
            tenant=prompt.tenant,
            text=f"answer to {prompt.text}",
        )


def _walk(sender: _Echo, prompts: list[Prompt], users: int, requests: int, pause_s: float = 0.0) -> float:
    t0 = time.perf_counter()
    asyncio.run(
        drive(
            sender,
            cycle(prompts),
            LoadShape(mode="closed", concurrency=users),
            Window(duration_s=10.0, requests=requests, drain_s=0.5),
            lambda r: None,
        )
    )
    return time.perf_counter() - t0


def _shape(**kw) -> ConversationShape:
    return ConversationShape(**{"count": 3, "turns": 4, "output_tokens": 8, **kw})


def test_each_turn_carries_the_history_with_the_engines_answers():
    questions = synthetic_prompts(6, 8, 12, seed=3)
    convs = conversation_prompts("you are terse", questions, _shape())
    sender = _Echo()
    _walk(sender, convs, users=3, requests=12)
    assert len(sender.sent) == 12
    by_conv: dict[str, list[Prompt]] = {}
    for p in sender.sent:
        by_conv.setdefault(p.conversation or "", []).append(p)
    assert sorted(by_conv) == ["c0", "c1", "c2"]
    for c, turns in by_conv.items():
        k = int(c[1:])
        assert [p.turn for p in turns] == [1, 2, 3, 4]
        for t, p in enumerate(turns):
            assert p.text == questions[k * 4 + t].text
            # the system prompt, then each earlier question and the answer the engine gave to it
            said = [("system", "you are terse")]
            for q in turns[:t]:
                said += [("user", q.text), ("assistant", f"answer to {q.text}")]
            assert list(p.history) == said


def test_a_failed_turn_ends_its_conversation_and_the_user_starts_the_next():
    convs = conversation_prompts("", synthetic_prompts(6, 8, 12, seed=3), _shape())
    sender = _Echo(fail_turn=2)
    _walk(sender, convs, users=1, requests=6)
    assert [(p.conversation, p.turn) for p in sender.sent] == [
        ("c0", 1),
        ("c0", 2),
        ("c1", 1),
        ("c1", 2),
        ("c2", 1),
        ("c2", 2),
    ]
    assert sender.sent[0].history == ()  # no system prompt asked: none sent


class _Skewed(_Echo):
    """Answers conversation c1 slowly and the others at once: the other users finish theirs while
    c1's user still owes turns."""

    async def send(self, request_id, prompt, max_tokens, scheduled_at, attempt=0):
        if prompt.conversation == "c1":
            await asyncio.sleep(0.05)
        return await super().send(request_id, prompt, max_tokens, scheduled_at, attempt)


def test_a_window_of_count_x_turns_requests_walks_each_conversation_once():
    """Three users share six 3-turn conversations in an 18-request window: a user done early starts
    no conversation whose turns the others' conversations still owe, so none is walked twice."""
    convs = conversation_prompts("", synthetic_prompts(6, 8, 18, seed=3), _shape(count=6, turns=3))
    sender = _Skewed()
    _walk(sender, convs, users=3, requests=18)
    walks: dict[str, list[int]] = {}
    for p in sender.sent:
        walks.setdefault(p.conversation or "", []).append(p.turn or 0)
    assert walks == {f"c{i}": [1, 2, 3] for i in range(6)}, walks


def test_a_tool_call_pauses_the_conversation_between_its_turns():
    convs = conversation_prompts(
        "", synthetic_prompts(6, 8, 4, seed=3), _shape(count=1, tool_every=1, tool_pause_s=0.2)
    )
    assert convs[0].pauses_s == (0.2, 0.2, 0.2)
    took = _walk(_Echo(), convs, users=1, requests=4)
    assert took >= 0.6  # three pauses between four turns


@given(count=st.integers(1, 500), shares=st.lists(st.floats(0.1, 10), min_size=1, max_size=5))
def test_tenants_take_their_share_of_the_conversations(count, shares):
    tenants = [(f"t{i}", s) for i, s in enumerate(shares)]
    got = [tenant_of(c, count, tenants) for c in range(count)]
    total = sum(shares)
    for name, share in tenants:
        assert abs(got.count(name) - count * share / total) <= len(tenants)
    # consecutive runs, in the order given
    order = [t for i, t in enumerate(got) if i == 0 or got[i - 1] != t]
    assert order == [n for n, _ in tenants if n in order]


def test_the_plan_refuses_what_it_cannot_walk():
    ok = {"conversations": {"count": 2, "turns": 3, "user_tokens": 16, "output_tokens": 8}}
    assert InputSet.model_validate(ok).conversations is not None
    for bad in (
        {**ok, "synthetic": {"prompt_tokens": 8, "output_tokens": 8}},
        {"conversations": {**ok["conversations"], "tenants": [{"name": "a"}, {"name": "a"}]}},
        {"conversations": {**ok["conversations"], "tenants": [{"name": "a", "slo": {"p97_ttft_ms": 1}}]}},
    ):
        with pytest.raises(ValidationError):
            InputSet.model_validate(bad)


PLAN = """kind: experiment
name: conversations
target:
  kind: sim
  model: qwen2.5-1.5b-instruct
  sim: {gpu: l4, engine: vllm, speed: 20, max_model_len: 4096, max_num_seqs: 16, seed: 7,
        extra_args: [--enable-prompt-tokens-details]}
fixed:
  input:
    conversations:
      count: 6
      turns: 3
      system_prompt_tokens: 256
      user_tokens: 32
      output_tokens: 16
      tenants:
        - {name: chat, share: 2, slo: {p95_ttft_ms: 60000}}
        - {name: batch, share: 1, slo: {p95_ttft_ms: 0.001}}
  ignore_eos: true
change: {variable: concurrency, baseline: 1, steps: [3]}
phases: {requests: 18, duration_s: 20, drain_s: 2}
rounds: 1
load: {mode: closed, concurrency: 1}
samplers: {interval_s: 0.5, sources: [engine, health]}
"""


@pytest.mark.slow
def test_conversations_on_the_rehearsal_server(tmp_path):
    """Every turn stored with its conversation, turn and tenant; later turns served from the prefix
    cache (the system prompt and the history); each tenant judged against its own SLO."""
    db = tmp_path / "v.db"
    (tmp_path / "plan.yaml").write_text(PLAN)
    r = subprocess.run(
        [VRAMLAB, "run", str(tmp_path / "plan.yaml"), "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    run_id = json.loads(r.stdout)["run_id"]
    rows = (
        sqlite3.connect(db)
        .execute(
            "SELECT conversation, turn, tenant, prompt_tokens, cached_tokens, error_class FROM requests"
            " WHERE run_id = ? AND phase = 'treatment' ORDER BY sent_s",
            (run_id,),
        )
        .fetchall()
    )
    assert len(rows) == 18 and all(r[5] is None for r in rows)
    turns: dict[str, list[tuple]] = {}
    for row in rows:
        turns.setdefault(row[0], []).append(row)
    assert sorted(turns) == [f"c{i}" for i in range(6)]
    for c, got in turns.items():
        assert [g[1] for g in got] == [1, 2, 3]
        assert {g[2] for g in got} == {"chat" if int(c[1:]) < 4 else "batch"}
        # the history grows turn by turn, and the engine's prefix cache serves what came before
        assert got[0][3] < got[1][3] < got[2][3]
        assert got[1][4] >= 256 and got[2][4] > got[1][4]
    rep = subprocess.run(
        [VRAMLAB, "report", run_id, "--db", str(db), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rep.returncode == 0, rep.stderr
    tenants = {
        t["tenant"]: t for t in json.loads(rep.stdout)["sections"]["tenants"] if t["phase"] == "treatment"
    }
    assert tenants["chat"]["meets"] is True and tenants["chat"]["requests"]["count"] == 12
    assert tenants["batch"]["meets"] is False and tenants["batch"]["broken"] == ["p95_ttft_ms"]
    assert tenants["chat"]["requests"]["goodput_rps"] > 0 and tenants["batch"]["requests"]["goodput_rps"] == 0
