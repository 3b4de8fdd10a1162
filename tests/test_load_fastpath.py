"""The client's token-chunk fast path must count exactly what a full JSON parse counts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlab.load import sse as sse_mod
from vramlab.load.client import OpenAIClient
from vramlab.load.sse import Stream, token_piece


class _Reads:
    """aiohttp's StreamReader as the client reads it: readany() until b""."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = list(reads)

    async def readany(self) -> bytes:
        return self.reads.pop(0) if self.reads else b""


pieces = st.one_of(
    st.none(),
    st.just(""),
    st.text(max_size=12),
    st.sampled_from(['"', "\\", '"content": "x"', '"usage"', "null", '""', "}"]),
)


@st.composite
def chunks(draw: Any, chat: bool) -> dict[str, Any]:
    choices = []
    for _ in range(draw(st.integers(0, 2))):
        ch: dict[str, Any] = {"index": 0}
        piece = draw(pieces)
        if chat:
            delta: dict[str, Any] = {}
            if draw(st.booleans()):
                delta["role"] = "assistant"
            if draw(st.booleans()) or piece:
                delta["content"] = piece
            if draw(st.booleans()):
                delta["reasoning_content"] = draw(pieces)
            if draw(st.booleans()):
                delta["reasoning"] = draw(pieces)
            ch["delta"] = delta
        elif draw(st.booleans()) or piece:
            ch["text"] = piece
        if draw(st.booleans()):
            ch["finish_reason"] = draw(st.sampled_from([None, "stop", "length"]))
        choices.append(ch)
    obj: dict[str, Any] = {"id": "c", "object": "x", "choices": choices}
    if draw(st.booleans()):
        obj["usage"] = draw(
            st.sampled_from(
                [
                    None,
                    {"prompt_tokens": 3, "completion_tokens": 2},
                    {"completion_tokens": 7},
                    {"prompt_tokens": 3, "completion_tokens": 2.5},
                    {"prompt_tokens": True, "completion_tokens": -1},
                    {
                        "prompt_tokens": 3,
                        "completion_tokens": 2,
                        "prompt_tokens_details": {"cached_tokens": 1},
                    },
                    {
                        "prompt_tokens": 3,
                        "completion_tokens": 4,
                        "completion_tokens_details": {"reasoning_tokens": 2},
                    },
                    {"prompt_tokens": "3", "completion_tokens": 2},
                ]
            )
        )
    return obj


def _count(c: OpenAIClient, payload: bytes, fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(sse_mod, "token_piece", lambda payload, key: None)
        s = Stream()
        c.sse.event(b"data: " + payload, 1.0, s)
    # finished matters only for a stream without a token (an empty completion): compare what it decides
    return (
        s.first,
        tuple(s.times),
        s.reasoning,
        s.finished or bool(s.times),
        s.usage_out,
        s.usage_in,
        s.usage_reasoning,
        s.error,
        s.done,
    )


@pytest.mark.parametrize("api", ["openai-chat", "openai-completions"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fast_path_counts_what_the_full_parse_counts(api: str, data: Any) -> None:
    monkeypatch = pytest.MonkeyPatch()
    c = OpenAIClient("http://127.0.0.1:1", "m", api)  # type: ignore[arg-type]
    obj = data.draw(chunks(api == "openai-chat"))
    sep = data.draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    payload = json.dumps(obj, separators=sep, ensure_ascii=data.draw(st.booleans())).encode()
    assert _count(c, payload, True, monkeypatch) == _count(c, payload, False, monkeypatch)


def test_plain_chunks_skip_the_parse_and_others_do_not() -> None:
    chat = b'"content":'
    content, reasoning = sse_mod.CONTENT, sse_mod.REASONING
    assert token_piece(b'{"choices":[{"index":0,"delta":{"content":"hi"}}]}', chat) == content
    # the role chunk and an empty or null content take the full parse (it may carry the finish_reason)
    assert token_piece(b'{"choices": [{"delta": {"role": "assistant", "content": ""}}]}', chat) is None
    assert token_piece(b'{"choices":[{"delta":{"content":null}}]}', chat) is None
    # vLLM's reasoning parser: reasoning_content (older) or reasoning (newer), content null or absent
    assert (
        token_piece(b'{"choices":[{"delta":{"reasoning_content":"Let","content":null}}]}', chat) == reasoning
    )
    assert token_piece(b'{"choices":[{"delta":{"reasoning":" me"}}]}', chat) == reasoning
    assert token_piece(b'{"choices":[{"delta":{"reasoning_content":"","content":"x"}}]}', chat) == content
    assert token_piece(b'{"choices":[],"usage":{"completion_tokens":3}}', chat) is None
    assert token_piece(b'{"error":{"message":"CUDA out of memory"}}', chat) is None
    assert token_piece(b'{"choices":[{"delta":{"content":"hi"', chat) is None  # truncated: parse, and fail
    assert token_piece(b"not json", chat) is None
    assert token_piece(b'{"choices":[{"text":" t1"}]}', b'"text":') == content


@pytest.mark.parametrize("wire", [b"\n\n", b"\r\n\r\n"])
def test_events_split_across_reads_are_put_back_together(wire: bytes) -> None:
    import asyncio

    events = [
        b'data: {"choices":[{"delta":{"reasoning_content":"a"}}]}',
        b'data: {"choices":[{"delta":{"content":"b"}}]}',
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}',
        b"data: [DONE]",
    ]
    raw = wire.join(events) + wire

    class Resp:  # 7-byte reads: every boundary falls mid-event somewhere
        content = _Reads([raw[i : i + 7] for i in range(0, len(raw), 7)])

    c = OpenAIClient("http://127.0.0.1:1", "m")
    s = Stream()
    asyncio.run(c._read_stream(Resp(), s))
    assert len(s.times) == 2 and s.reasoning == 1 and s.finished and s.done


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_whole_event_reads_count_what_the_event_parser_counts(data: Any) -> None:
    """A read that is exactly one event takes a shortcut in _read_stream (the usual read while
    streaming); whatever the reads look like, the stream comes out as the event parser has it."""
    import asyncio

    objs = data.draw(st.lists(chunks(True), min_size=1, max_size=6))
    events = [b"data: " + json.dumps(o, separators=(",", ":")).encode() for o in objs] + [b"data: [DONE]"]
    whole = data.draw(st.booleans())
    if whole:  # one read per event: the shortcut's case
        reads = [e + b"\n\n" for e in events]
    else:
        raw = b"".join(e + b"\n\n" for e in events)
        cut = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=5))))
        reads = [raw[a:b] for a, b in zip([0, *cut], [*cut, len(raw)], strict=False)]

    class Resp:
        content = _Reads(reads)

    c = OpenAIClient("http://127.0.0.1:1", "m")
    got = Stream()
    asyncio.run(c._read_stream(Resp(), got))
    want = Stream()
    for e in events:
        c.sse.event(e, 0.0, want)
        if want.done:
            break
    assert (len(got.times), got.reasoning, got.finished or bool(got.times), got.usage_out, got.error) == (
        len(want.times),
        want.reasoning,
        want.finished or bool(want.times),
        want.usage_out,
        want.error,
    )
