"""The rehearsal server's prefix cache: full blocks known by content and held once, kept after their
last user until a new block needs their memory (least recently freed first), hits and queries
counted in tokens and exported under each engine's own names."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from vramlab.sim.prefix_cache import PrefixCache, block_hashes
from vramlab.sim.scheduler import Request, Scheduler

BS = 16


def _held(s: Scheduler) -> int:
    """Blocks in use: every running request's own ones, and each shared one once."""
    shared = len(s.cache.used) if s.cache is not None else 0
    return sum(r.blocks - len(r.shared) for r in s.running) + shared


def _drain(s: Scheduler, max_steps: int = 20_000) -> None:
    steps = 0
    while (s.running or s.waiting) and steps < max_steps:
        s.complete(s.schedule(), float(steps))
        assert s.free_blocks + _held(s) == s.num_blocks
        assert s.cache is None or len(s.cache.free) <= s.free_blocks  # cached free blocks are free ones
        steps += 1
    assert not s.running and not s.waiting


def _req(name: str, tokens: list[str], out: int = 4) -> Request:
    r = Request(name, len(tokens), out, out)
    r.hashes, r.tail = block_hashes(tokens, BS)
    return r


def _sched(blocks: int = 64) -> Scheduler:
    s = Scheduler(blocks, BS, max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=4096)
    s.cache = PrefixCache()
    s.generated_tokens = lambda r: [f"g{r.id}{i}" for i in range(r.generated)]
    return s


def test_equal_prefixes_hash_equal_until_they_part():
    a = [f"t{i}" for i in range(100)]
    b = a[:40] + ["x"] + a[41:]
    ha, tail = block_hashes(a, BS)
    hb, _ = block_hashes(b, BS)
    assert len(ha) == 6 and tail == tuple(a[96:])
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    assert all(x != y for x, y in zip(ha[2:], hb[2:], strict=True))  # a chain: everything after parts too


def test_a_second_request_with_the_same_prefix_computes_only_the_rest():
    s = _sched()
    system = [f"s{i}" for i in range(64)]  # 4 full blocks
    first = _req("a", [*system, *(f"a{i}" for i in range(20))])
    s.add(first)
    _drain(s)
    second = _req("b", [*system, *(f"b{i}" for i in range(20))])
    s.add(second)
    batch = s.schedule()
    ((req, computed),) = batch.scheduled
    assert req is second and second.cached_tokens == 64 and computed == 84 - 64
    assert s.cache is not None and s.cache.hits_tokens == 64 and s.cache.queries_tokens == 168
    s.complete(batch, 0.0)
    _drain(s)
    assert s.free_blocks == s.num_blocks  # everything free again (cached blocks are free blocks)


def test_a_whole_cached_prompt_still_computes_its_last_token():
    s = _sched()
    tokens = [f"s{i}" for i in range(64)]
    s.add(_req("a", tokens))
    _drain(s)
    again = _req("b", tokens)
    s.add(again)
    ((req, computed),) = s.schedule().scheduled
    assert again.cached_tokens == 48 and computed == 16  # three blocks shared, the fourth recomputed


def test_shared_blocks_are_held_once_so_more_requests_fit():
    system = [f"s{i}" for i in range(96)]  # 6 blocks
    cached, plain = _sched(blocks=20), _sched(blocks=20)
    plain.cache = None
    for s in (cached, plain):
        s.add(_req("warm", [*system, "w"], out=1))
        _drain(s)
        for i in range(4):
            s.add(_req(f"r{i}", [*system, *(f"u{i}{j}" for j in range(8))], out=8))
        s.schedule()
    assert len(cached.running) == 4  # 6 shared + 4 x 1 own block = 10 of 20
    assert len(plain.running) == 2  # 7 blocks each: two fit in 20


def test_pressure_evicts_the_block_freed_longest_ago():
    s = _sched(blocks=8)
    old = [f"o{i}" for i in range(32)]  # 2 blocks
    new = [f"n{i}" for i in range(32)]
    s.add(_req("old", [*old, "x"], out=1))
    _drain(s)
    s.add(_req("new", [*new, "y"], out=1))
    _drain(s)
    assert s.cache is not None and len(s.cache.free) == 4
    s.add(_req("big", [f"b{i}" for i in range(6 * BS)], out=1))  # 6 blocks: 2 of the 4 cached must go
    _drain(s)
    assert s.cache.evictions >= 2
    s.add(_req("new-again", [*new, "z"], out=1))
    s.add(_req("old-again", [*old, "z"], out=1))
    s.schedule()
    by = {r.id: r.cached_tokens for r in s.running}
    assert by["new-again"] == 32 and by["old-again"] == 0  # the older prefix went first


def test_a_conversations_next_turn_hits_its_answer_too():
    s = _sched()
    turn1 = _req("c1", [f"p{i}" for i in range(40)], out=30)
    s.add(turn1)
    _drain(s)
    answer = [f"gc1{i}" for i in range(30)]  # what generated_tokens says it produced
    turn2 = _req("c2", [*(f"p{i}" for i in range(40)), *answer, "next", "question"])
    s.add(turn2)
    s.schedule()
    # KV of prompt + 29 generated tokens = 69: four full blocks known by content
    assert turn2.cached_tokens == 64


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 80), st.integers(1, 12)), min_size=1, max_size=25),
    st.integers(6, 40),
)
def test_the_pool_never_loses_or_makes_a_block(reqs: list[tuple[int, int, int]], blocks: int) -> None:
    s = _sched(blocks=blocks)
    prefixes = [[f"p{k}_{i}" for i in range(48)] for k in range(4)]
    rng = random.Random(len(reqs))
    for n, (k, extra, out) in enumerate(reqs):
        tokens = [*prefixes[k][: rng.randint(0, 48)], *(f"r{n}_{i}" for i in range(extra))]
        if len(tokens) + out + 1 > blocks * BS:
            continue
        s.add(_req(f"r{n}", tokens, out))
        if rng.random() < 0.5:
            s.complete(s.schedule(), float(n))
            assert s.free_blocks + _held(s) == s.num_blocks
    _drain(s)
    assert s.free_blocks == s.num_blocks and s.cache is not None and not s.cache.used


# -- the server ---------------------------------------------------------------------------------


def _chat(
    system: str, user: str, history: list[dict[str, str]] | None = None, out: int = 8
) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": system},
            *(history or []),
            {"role": "user", "content": user},
        ],
        "max_tokens": out,
        "ignore_eos": True,
    }


async def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
        out: dict[str, Any] = await r.json()
        return out


async def _metrics(url: str) -> dict[str, float]:
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return {x.name: x.value for f in text_string_to_metric_families(text) for x in f.samples}


def _serve(tmp_path, **kw: Any) -> Any:
    from vramlab.sim.config import SimConfig
    from vramlab.sim.server import SimServer
    from vramlab.sim.testing import make_estimate

    cfg = SimConfig(speed=500, estimate=make_estimate(), device=str(tmp_path / "gpu0.ledger"), **kw)
    return SimServer(cfg, log_stream=open("/dev/null", "w"))


def test_the_server_counts_hits_as_vllm_names_them_and_says_cached_tokens(tmp_path) -> None:
    system = " ".join(["policy"] * 300)  # 600 tokens of the sim's tokenizer

    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, float]]:
        async with _serve(tmp_path, prompt_tokens_details=True) as srv:
            a = await _post(srv.url, _chat(system, "first question here", out=40))
            b = await _post(srv.url, _chat(system, "another one entirely"))
            answer = a["choices"][0]["message"]["content"]
            c = await _post(
                srv.url,
                _chat(
                    system,
                    "and a follow up",
                    [
                        {"role": "user", "content": "first question here"},
                        {"role": "assistant", "content": answer},
                    ],
                ),
            )
            return a, b, c, await _metrics(srv.url)

    a, b, c, m = asyncio.run(go())
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    hit_b = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < hit_b <= 604 and hit_b % 16 == 0  # the system prompt's full blocks (and no more)
    hit_c = c["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the first turn's whole KV (its prompt and 39 of its 40 answer tokens) in full blocks: the answer too
    assert hit_c == 16 * ((a["usage"]["prompt_tokens"] + 39) // 16) > a["usage"]["prompt_tokens"]
    queries = sum(x["usage"]["prompt_tokens"] for x in (a, b, c))
    assert m["vllm:prefix_cache_queries_total"] == queries
    assert m["vllm:prefix_cache_hits_total"] == hit_b + hit_c


def test_names_by_release_and_engine_and_off_switch(tmp_path) -> None:
    async def names(**kw: Any) -> set[str]:
        async with _serve(tmp_path, **kw) as srv:
            await _post(srv.url, _chat("x " * 40, "y"))
            return {k for k in await _metrics(srv.url) if "cache_hit" in k or "prefix_cache" in k}

    assert asyncio.run(names(engine_version="0.8.5")) == {
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
    }
    assert asyncio.run(names(engine_version="0.7.3", prefix_caching=True)) == {
        "vllm:gpu_prefix_cache_hit_rate"
    }
    assert asyncio.run(names(engine_version="0.7.3")) == set()  # V0: off unless asked
    assert asyncio.run(names(prefix_caching=False)) == set()
    assert asyncio.run(names(engine="sglang")) == {"sglang:cache_hit_rate"}


def test_usage_without_the_flag_says_no_cached_tokens(tmp_path) -> None:
    async def go() -> dict[str, Any]:
        async with _serve(tmp_path) as srv:
            return await _post(srv.url, _chat("x", "y"))

    assert "prompt_tokens_details" not in json.dumps(asyncio.run(go()))
