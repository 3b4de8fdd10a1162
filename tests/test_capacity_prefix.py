"""The plan's prefix-sharing figure: how many more users the pool holds when every request shares
its first N tokens, counted in full blocks as the engines share them; and the rehearsal server's
scheduler, which shares blocks on its own (sim/prefix_cache.py), admits that many."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlab.capacity import estimate, get_gpu
from vramlab.capacity.prefix import prefix_sharing
from vramlab.capacity.settings import EngineSettings
from vramlab.sim.prefix_cache import PrefixCache, block_hashes
from vramlab.sim.scheduler import Request, Scheduler
from vramlab.sources import resolve_model

VRAMLAB = str(Path(sys.executable).with_name("vramlab"))


def _est(engine: str = "vllm", version: str | None = None, max_model_len: int = 4096):
    s = EngineSettings(engine=engine, engine_version=version, max_model_len=max_model_len)
    return estimate(resolve_model("llama-3.1-8b-instruct"), get_gpu("l4"), s)


def _admitted(est, shared: int, length: int, cache: bool) -> int:
    """Requests of *length* tokens (the prompt all but the last: its KV is never written) that the
    sim's scheduler runs at once on the plan's pool, after one request warmed the shared prefix."""
    s = Scheduler(est.num_blocks, est.block_size, 10_000, 10**9, 10**9)
    if cache:
        s.cache = PrefixCache()
    prefix = [f"s{i}" for i in range(shared)]

    def req(name: str, tokens: list[str], out: int) -> Request:
        r = Request(name, len(tokens), out, out)
        r.hashes, r.tail = block_hashes(tokens, est.block_size)
        return r

    s.add(req("warm", [*prefix, "w"], 1))
    while s.running or s.waiting:
        s.complete(s.schedule(), 0.0)
    for i in range(int(est.num_blocks)):
        s.add(req(f"r{i}", [*prefix, *(f"u{i}_{j}" for j in range(length - 1 - shared))], 1))
    s.schedule()
    return len(s.running)


@pytest.mark.parametrize(("shared", "length"), [(0, 1000), (600, 1000), (2000, 3000), (3000, 3001), (40, 50)])
def test_the_plan_counts_what_the_scheduler_admits(shared: int, length: int) -> None:
    est = _est()
    p = prefix_sharing(est, shared, length)
    assert int(p.users_without) == _admitted(est, shared, length, cache=False)
    assert int(p.users_with) == _admitted(est, shared, length, cache=True)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 8000), st.integers(1, 8192), st.integers(0, 500))
def test_more_sharing_never_holds_fewer_users(shared: int, length: int, extra: int) -> None:
    est = _est(max_model_len=8192)
    a, b = prefix_sharing(est, shared, length), prefix_sharing(est, shared + extra, length)
    assert a.users_with >= a.users_without > 0
    assert b.users_with >= a.users_with - 1e-9
    assert prefix_sharing(est, 0, length).more_users == 0


@pytest.mark.parametrize(
    ("engine", "version", "applies"),
    [("vllm", None, True), ("vllm", "0.7.3", False), ("sglang", None, True), ("llama.cpp", None, False)],
)
def test_which_engines_hold_a_shared_prefix_once(engine: str, version: str | None, applies: bool) -> None:
    p = prefix_sharing(_est(engine, version), 2048, 3000)
    assert p.applies is applies and (p.more_users > 0) is applies and p.why


def test_the_plan_command_says_it_and_puts_it_in_the_json() -> None:
    args = ["plan", "--model", "llama-3.1-8b-instruct", "--gpu", "l4", "--max-model-len", "4096"]
    args += ["--prefix-shared-tokens", "2000", "--request-tokens", "3000"]
    text = subprocess.run([VRAMLAB, *args], capture_output=True, text=True, timeout=60).stdout
    assert "prefix sharing: 2,000 of 3,000 tokens shared by every request" in text and "held once" in text
    js = json.loads(
        subprocess.run([VRAMLAB, *args, "--json"], capture_output=True, text=True, timeout=60).stdout
    )
    p = js["prefix_sharing"]
    assert p["shared_blocks"] == 125 and p["users_with"] > p["users_without"] and p["more_users"] > 0
