"""N prompt tokens means N tokens of the target's tokenizer: the prompt maker sizes each prompt with a
counter, the engine's tokenize endpoint is found by its request shape, what the engine adds around
the text is measured with one request, and where nothing can count the prompts say they are an estimate."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _threaded_app import serve_app
from vramlab.load.prompts import CountFailed, PromptMaker
from vramlab.load.tokens import SHAPES, EngineTokenizer, open_prompt_maker


class PiecesCounter:
    """A tokenizer whose words cost 1-3 tokens (one per started 3 letters), like a small vocabulary."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls, self.fail_after = 0, fail_after

    async def count(self, text: str) -> int:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise CountFailed("gone")
        return 1 + sum(-(-len(p) // 3) for p in re.findall(r"\w+|[^\w\s]", text))  # + a BOS


@settings(max_examples=40, deadline=None)
@given(target=st.integers(min_value=20, max_value=6000), added=st.integers(min_value=0, max_value=9))
def test_prompts_hit_the_counted_length(target: int, added: int) -> None:
    # (a prompt is never shorter than its unique head, "#3-0:", and one word: ~8 tokens here)
    counter = PiecesCounter()
    maker = PromptMaker(counter, added)
    prompts = asyncio.run(maker.synthetic(target, 8, 6, seed=3))
    assert len({p.text for p in prompts}) == 6  # each its own
    for p in prompts:
        counted = asyncio.run(counter.count(p.text)) + added
        assert p.prompt_tokens == counted  # the prompt carries its true count, not the target
        assert abs(counted - target) <= max(1, 0.02 * target), (target, counted)
        assert p.tokens_source == "tokenizer"
    assert counter.calls <= 8 + 2 + 2 * 6  # a few counts a set, not a search per prompt


def test_same_seed_same_prompts_and_sets_are_cached() -> None:
    a = PromptMaker(PiecesCounter())
    p1 = asyncio.run(a.synthetic(300, 8, 4, seed=9))
    assert asyncio.run(PromptMaker(PiecesCounter()).synthetic(300, 8, 4, seed=9)) == p1
    counter = PiecesCounter()
    b = PromptMaker(counter)

    async def twice() -> None:
        await b.synthetic(300, 8, 4, seed=9)
        n = counter.calls
        await b.synthetic(300, 8, 4, seed=9)
        assert counter.calls == n

    asyncio.run(twice())


def test_a_counter_that_fails_leaves_prompts_labelled_an_estimate() -> None:
    prompts = asyncio.run(PromptMaker(PiecesCounter(fail_after=2)).synthetic(200, 8, 3, seed=1))
    assert {p.tokens_source for p in prompts} == {"estimate"} and prompts[0].prompt_tokens == 200
    unknown = asyncio.run(PromptMaker(PiecesCounter(), 5, added_known=False).synthetic(200, 8, 3, seed=1))
    assert {p.tokens_source for p in unknown} == {"estimate"}  # the template's share was not measured


def test_no_counter_is_an_estimate() -> None:
    prompts = asyncio.run(PromptMaker().synthetic(100, 8, 2, seed=1))
    assert {p.tokens_source for p in prompts} == {"estimate"}


# -- the engine's endpoint, by its request shape ------------------------------------------------


def _app(kind: str, usage: bool = True) -> Any:
    """A fake engine answering one tokenize shape (its real request and answer) and completions."""
    from aiohttp import web

    def n_of(text: str) -> int:
        return len(text.split()) + 1

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        if kind == "vllm" and isinstance(body.get("prompt"), str):
            n = n_of(body["prompt"])
            return web.json_response({"count": n, "max_model_len": 4096, "tokens": list(range(n))})
        if kind == "llama-server":
            # llama-server answers a body without "content" with no tokens, not an error
            text = body.get("content")
            return web.json_response({"tokens": list(range(n_of(text))) if isinstance(text, str) else []})
        if kind == "tgi" and isinstance(body.get("inputs"), str):
            n = n_of(body["inputs"])
            return web.json_response([{"id": i, "text": "x", "start": 0, "stop": 1} for i in range(n)])
        return web.json_response({"detail": "unprocessable"}, status=422)

    async def extras(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": list(range(n_of(body["input"])))})

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        text = body["messages"][0]["content"] if "messages" in body else body["prompt"]
        extra = 7 if "messages" in body else 0  # a chat template's role markers
        doc: dict[str, Any] = {"choices": [{"text": "x", "finish_reason": "length"}]}
        if usage:
            doc["usage"] = {"prompt_tokens": n_of(text) + extra, "completion_tokens": 1}
        return web.json_response(doc)

    def make() -> Any:
        app = web.Application()
        if kind == "llama-cpp-python":
            app.router.add_post("/extras/tokenize", extras)
        elif kind != "none":
            app.router.add_post("/tokenize", tokenize)
        app.router.add_post("/v1/completions", complete)
        app.router.add_post("/v1/chat/completions", complete)
        return app

    return make


@pytest.mark.parametrize(
    ("kind", "shape"),
    [
        ("vllm", "/tokenize (vLLM's API)"),
        ("llama-server", "/tokenize (llama-server's API)"),
        ("llama-cpp-python", "/extras/tokenize (llama-cpp-python)"),
        ("tgi", "/tokenize (TGI's API)"),
    ],
)
def test_the_tokenize_endpoint_is_found_by_its_shape(kind: str, shape: str) -> None:
    async def go(port: int) -> tuple[str, int]:
        async with EngineTokenizer(f"http://127.0.0.1:{port}", "m", {}) as tok:
            assert await tok.discover()
            return tok.source, await tok.count("one two three")

    with serve_app(_app(kind)) as port:
        source, n = asyncio.run(go(port))
    assert shape in source and n == 4


@pytest.mark.parametrize("api", ["openai-chat", "openai-completions"])
def test_what_the_engine_adds_is_measured_with_one_request(api: str) -> None:
    async def go(port: int) -> tuple[int, str]:
        async with contextlib.AsyncExitStack() as stack:
            maker, note = await open_prompt_maker(stack, f"http://127.0.0.1:{port}/v1", "m", api, None, 5)
            prompts = await maker.synthetic(120, 4, 2, seed=1)
            return prompts[0].prompt_tokens or 0, note

    with serve_app(_app("vllm")) as port:
        n, note = asyncio.run(go(port))
    assert n == 120  # as the engine would count it: the template's 7 included for chat
    added = 7 if api == "openai-chat" else 0
    assert f"adds {added} token" in note and "counted with the engine's POST /tokenize (vLLM's API)" in note


def test_no_endpoint_or_no_usage_is_said() -> None:
    async def go(port: int, api: str) -> tuple[str | None, str]:
        async with contextlib.AsyncExitStack() as stack:
            maker, note = await open_prompt_maker(stack, f"http://127.0.0.1:{port}", "m", api, None, 5)
            return (await maker.synthetic(50, 4, 1, seed=1))[0].tokens_source, note

    with serve_app(_app("none")) as port:
        source, note = asyncio.run(go(port, "openai-completions"))
    assert source == "estimate" and "an estimate (one token a word)" in note and "/extras/tokenize" in note
    with serve_app(_app("vllm", usage=False)) as port:
        source, note = asyncio.run(go(port, "openai-chat"))
    assert source == "estimate" and "reported no usage" in note


def test_the_sim_counts_on_tokenize_what_it_reports_in_usage(tmp_path) -> None:
    from vramlab.load.tokens import usage_prompt_tokens
    from vramlab.sim.config import SimConfig
    from vramlab.sim.server import SimServer
    from vramlab.sim.testing import make_estimate

    text = "#7-03: people through the water, numbers and 12345 of sound"

    async def go() -> tuple[int, int, int | None, int | None]:
        cfg = SimConfig(speed=200, estimate=make_estimate(), device=str(tmp_path / "gpu0.ledger"))
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            async with EngineTokenizer(srv.url, cfg.model_name, {}) as tok:
                assert await tok.discover() and "vLLM" in tok.source
                raw = await tok.count(text)
            async with EngineTokenizer(srv.url, cfg.model_name, {}) as tok:
                tok.shape = next(s for s in SHAPES if "llama-server" in s.name)
                as_llama = await tok.count(text)
            comp = await usage_prompt_tokens(srv.url, cfg.model_name, "openai-completions", {}, text, 10)
            chat = await usage_prompt_tokens(srv.url, cfg.model_name, "openai-chat", {}, text, 10)
            return raw, as_llama, comp, chat

    raw, as_llama, comp, chat = asyncio.run(go())
    assert raw == as_llama == comp and chat is not None and chat > raw


def test_a_model_directorys_own_tokenizer_counts_where_the_engine_has_no_endpoint(tmp_path) -> None:
    # transformers serve and Ollama answer no tokenize request: the model directory's tokenizer.json
    # (the one the engine loaded) counts, and the probe request measures what the engine adds (here 1)
    tokenizers = pytest.importorskip("tokenizers")
    from vramlab.load.prompts import _WORDS

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys([*_WORDS, "a"]))}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    (tmp_path / "model").mkdir()
    tok.save(str(tmp_path / "model" / "tokenizer.json"))

    async def go(port: int, model_dir: str | None) -> tuple[list[Any], str]:
        async with contextlib.AsyncExitStack() as stack:
            url = f"http://127.0.0.1:{port}"
            maker, note = await open_prompt_maker(stack, url, "m", "openai-completions", None, 5, model_dir)
            return await maker.synthetic(150, 4, 3, seed=2), note

    with serve_app(_app("none")) as port:
        prompts, note = asyncio.run(go(port, str(tmp_path / "model")))
        _, without = asyncio.run(go(port, str(tmp_path)))  # a directory without tokenizer.json
    assert "the model's own tokenizer" in note and "adds 1 token" in note, note
    # the fake engine counts words + 1: every prompt is 150 of its tokens, labelled counted
    assert {p.prompt_tokens for p in prompts} == {150} and {p.tokens_source for p in prompts} == {"tokenizer"}
    assert all(len(p.text.split()) + 1 == 150 for p in prompts)
    assert "an estimate" in without and "has no tokenizer.json" in without


# -- fresh prompts: a new one every request (drills on prefix-caching engines) -----------------


class ZerosCounter(PiecesCounter):
    """Counts a run of zeros as one token: heads of other digits count differently."""

    async def count(self, text: str) -> int:
        return await super().count(re.sub(r"0+", "0", text))


@settings(max_examples=25, deadline=None)
@given(target=st.integers(min_value=40, max_value=6000), added=st.integers(min_value=0, max_value=9))
def test_fresh_prompts_are_new_every_request_and_carry_their_count(target: int, added: int) -> None:
    counter = PiecesCounter()
    fresh = asyncio.run(PromptMaker(counter, added).fresh(target, 8, seed=1003))
    assert fresh is not None and fresh.tokens_source == "tokenizer"
    lanes = [fresh.stream(lane) for lane in (0, 1, 17)]
    prompts = [next(s) for s in lanes for _ in range(50)]
    assert len({p.text for p in prompts}) == len(prompts)  # no two requests share a prompt
    assert len({p.text[:40] for p in prompts}) == len(prompts)  # nor a first block
    for p in prompts[::37]:
        assert p.prompt_tokens == asyncio.run(counter.count(p.text)) + added  # its true count
    assert abs(fresh.prompt_tokens - target) <= max(1, 0.02 * target), (target, fresh.prompt_tokens)  # type: ignore[operator]


def test_fresh_prompts_give_way_to_a_counted_list_where_heads_count_unevenly() -> None:
    assert asyncio.run(PromptMaker(ZerosCounter()).fresh(300, 8, seed=2)) is None
    # without a counter, or when it stops answering: fresh, labelled an estimate
    assert asyncio.run(PromptMaker().fresh(300, 8, seed=2)).tokens_source == "estimate"  # type: ignore[union-attr]
    gone = asyncio.run(PromptMaker(PiecesCounter(fail_after=1)).fresh(300, 8, seed=2))
    assert gone is not None and gone.tokens_source == "estimate" and gone.prompt_tokens == 300


def test_each_drill_window_has_its_own_seed_and_a_recovery_at_the_failed_load_new_heads() -> None:
    """The baseline and the first ramp step once shared a seed: the step's prompts began with the
    baseline's words, and a prefix cache served them. A recovery that keeps the failed step's load
    sends that step's set (no count asked of a failed target) behind heads of its own."""
    from pathlib import Path

    import yaml

    from vramlab.drill.load import WindowPrompts, window_prompts_key
    from vramlab.drill.plan import parse_plan

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "oom-drill.yaml").read_text())
    plan = parse_plan(doc)
    keys = [window_prompts_key(plan, None, "baseline", 0, 0)]
    keys += [window_prompts_key(plan, v, "ramp", 0, i) for i, v in enumerate([256.0, 512.0, 1024.0])]
    keys += [
        window_prompts_key(plan, None, "recovery", 0, 0),
        window_prompts_key(plan, None, "baseline", 1, 0),
    ]
    assert len({seed for _, seed in keys}) == len(keys), keys
    wp = WindowPrompts(plan)

    async def sets() -> tuple[Any, Any]:
        return await wp.get(512.0, "ramp", 0, 1), await wp.get(512.0, "recovery", 0, 1)

    step, recovery = asyncio.run(sets())
    assert not isinstance(step, list) and not isinstance(recovery, list)
    a, b = next(step.stream(0)), next(recovery.stream(0))
    assert a.prompt_tokens == b.prompt_tokens and a.text != b.text and a.text[20:] == b.text[20:]
