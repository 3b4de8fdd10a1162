"""Token counts without usage in the stream: empty-content chunks are tokens (llama.cpp sends the
tokens that end inside a UTF-8 character as empty text), the role and final chunks are not, and an
engine's own count (llama-server's `timings.predicted_n`) wins over the counted chunks."""

from __future__ import annotations

import json

from vramlab.load.sse import SseAccounting, Stream


def _feed(api: str, payloads: list[dict | str]) -> Stream:
    acc, st = SseAccounting(api), Stream()  # type: ignore[arg-type]
    for i, p in enumerate(payloads):
        body = p if isinstance(p, str) else json.dumps(p)
        acc.feed(f"data: {body}\n\n".encode(), float(i), st, True)
    return st


def _c(text: str, finish: str | None = None, **extra) -> dict:
    return {
        "id": "x",
        "object": "text_completion",
        "choices": [{"text": text, "index": 0, "finish_reason": finish}],
        **extra,
    }


def test_empty_text_chunks_mid_stream_are_tokens_and_the_final_chunk_is_not():
    # what llama-cpp-python 0.3.x sent for max_tokens 16: 11 with text, 5 empty, then '' with finish_reason
    pieces = ["o", "\n", "", "1", "S", "", "", "n", " is", '"', "3", "", "x", "y", "", "z"]
    st = _feed("openai-completions", [*(_c(p) for p in pieces), _c("", "length"), "[DONE]"])
    assert len(st.times) == 16 and st.first == 0.0 and st.finished


def test_a_stream_of_only_empty_chunks_has_its_tokens_and_a_first_token():
    st = _feed("openai-completions", [*(_c("") for _ in range(16)), _c("", "length"), "[DONE]"])
    assert len(st.times) == 16 and st.first == 0.0


def test_chat_role_chunk_and_final_empty_delta_are_not_tokens():
    role = {"choices": [{"delta": {"role": "assistant"}, "index": 0, "finish_reason": None}]}
    role_empty = {
        "choices": [{"delta": {"role": "assistant", "content": ""}, "index": 0, "finish_reason": None}]
    }
    tok = [
        {"choices": [{"delta": {"content": c}, "index": 0, "finish_reason": None}]} for c in ("a", "", "b")
    ]
    final = {"choices": [{"delta": {}, "index": 0, "finish_reason": "length"}]}
    st = _feed("openai-chat", [role, role_empty, *tok, final, "[DONE]"])
    assert len(st.times) == 3 and st.first == 2.0


def test_llama_server_timings_are_the_engines_own_count():
    st = _feed(
        "openai-completions",
        [_c("ab"), _c("cd"), _c("", "length", timings={"predicted_n": 5, "prompt_n": 3}), "[DONE]"],
    )
    assert len(st.times) == 2 and st.engine_out == 5


def test_the_client_prefers_usage_then_the_engines_count_then_chunks():
    import asyncio

    from vramlab.load.client import OpenAIClient
    from vramlab.load.prompts import synthetic_prompts
    from vramlab.load.stub import StubBehaviour, StubServer

    async def go(usage: bool):
        async with StubServer(StubBehaviour(usage=usage)) as srv:
            async with OpenAIClient(srv.url, "stub-model", api="openai-completions") as c:
                p = synthetic_prompts(8, 4, 1, seed=1)[0]
                return await c.send("r0", p, 4, 0.0, 0)

    with_usage, without = asyncio.run(go(True)), asyncio.run(go(False))
    assert with_usage.output_tokens_source == "usage"
    assert without.output_tokens_source == "chunks" and without.output_tokens == 4
