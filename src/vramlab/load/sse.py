"""Token accounting of an OpenAI-compatible SSE stream: which event is a token, when it came, and usage.

A token is a chunk with non-empty ``content`` (chat), ``text`` (completions), or, from
reasoning models, ``reasoning_content`` / ``reasoning`` (vLLM, SGLang), or an empty one mid-stream
(not the role chunk, not the final one: llama.cpp sends a token that ends inside a UTF-8 character
as empty text): the first of any kind is the first token. Output tokens are the server's
``usage`` when it sends one, else the engine's own count where the stream carries it (llama.cpp
``timings.predicted_n``, ``output_tokens_source: timings``), else the counted chunks
(``output_tokens_source: chunks``, an estimate: a chunk may carry several tokens). A token event that
came in one read with bytes that followed it has only an upper bound for its time: it is marked
coalesced. client.py drives this, read by read, from either HTTP client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

# One SSE event larger than this (a server that never sends the blank line) ends the stream as broken:
# the client must not buffer an endless line.
MAX_EVENT_BYTES = 1 << 20


@dataclass(slots=True)
class Stream:
    """One response's token accounting while its SSE body is read."""

    first: float | None = None
    times: list[float] = field(default_factory=list)  # every token chunk, content or reasoning
    coalesced: list[int] = field(default_factory=list)  # indices into times that are upper bounds
    buf: bytes = b""  # an SSE event not yet complete
    reasoning: int = 0  # how many of them carried reasoning (reasoning_content / reasoning), not content
    usage_out: int | None = None
    usage_in: int | None = None
    usage_reasoning: int | None = None
    engine_out: int | None = None  # generated tokens as the engine counted them (llama-server's timings)
    # prompt tokens the engine's prefix cache served: usage.prompt_tokens_details.cached_tokens (vLLM
    # with --enable-prompt-tokens-details, llama-server, SGLang), else llama-server's timings.cache_n
    cached: int | None = None
    text: list[str] | None = None  # the answer's text, kept only when asked (a conversation's turn)
    error: str | None = None
    done: bool = False  # [DONE] seen
    finished: bool = False  # a finish_reason came in a chunk without a token (an empty completion's proof)


CONTENT, REASONING = 1, 2
_REASONING_KEYS = (b'"reasoning_content":', b'"reasoning":')


def _has_text(payload: bytes, key: bytes) -> bool | None:
    """Is ``key`` there once with a non-empty string after it? False when absent, ``""`` or null;
    None when it is there twice or its value is not a plain string or null (the caller parses)."""
    i = payload.find(key)
    if i < 0:
        return False
    j = i + len(key)
    if payload.find(key, j) >= 0:
        return None
    while payload[j : j + 1] == b" ":
        j += 1
    head = payload[j : j + 2]
    if head[:1] == b'"':
        return head != b'""'
    return False if payload.startswith(b"null", j) else None


def token_piece(payload: bytes, key: bytes) -> int | None:
    """Is this a plain token chunk, and of what? ``CONTENT`` or ``REASONING``; None: the caller parses.

    Parsing JSON for every token is most of the client's cost per token on long streams, and all a
    token chunk tells us is "a token arrived now" (and whether it was reasoning). A chunk is plain
    when it is one JSON object with no usage or error and exactly one ``"content":`` (chat, in a
    delta) or ``"text":`` (completions) key holding a non-empty string, or, in chat, an empty or
    null content and exactly one non-empty ``"reasoning_content":`` / ``"reasoning":`` (vLLM,
    SGLang with a reasoning parser). Anything else (the role chunk, the final chunk with its
    finish_reason, usage, errors, tool calls, several choices, garbage) takes the full parse: a
    few chunks per request.
    """
    if not (payload.startswith(b"{") and payload.endswith(b"}")):
        return None
    if b'"usage"' in payload or b'"error"' in payload:
        return None
    if key == b'"content":' and b'"delta"' not in payload:
        return None  # chat text counts only inside a delta
    has = _has_text(payload, key)
    if has is None:
        return None
    if key != b'"content":' or b'"reasoning' not in payload:
        return CONTENT if has else None
    reasoning = False
    for rk in _REASONING_KEYS:
        h = _has_text(payload, rk)
        if h is None:
            return None
        reasoning = reasoning or h
    if has:
        # content and reasoning in one chunk: which choice came first decides; parse (rare)
        return None if reasoning else CONTENT
    return REASONING if reasoning else None


class SseAccounting:
    """Reads one API's SSE events into a Stream: ``feed`` once per read of the body."""

    def __init__(self, api: Literal["openai-chat", "openai-completions"]) -> None:
        self.api = api
        self._piece_key = b'"text":' if api == "openai-completions" else b'"content":'

    def feed(self, chunk: bytes, now: float, st: Stream, exact: bool) -> bool:
        """One read of the stream's body, received at ``now``; True once the stream is over ([DONE],
        an error). ``exact``: nothing followed these bytes in the read, so ``now`` is when the last
        of them arrived. A token event followed by other bytes in the same read arrived at some
        unknown time before ``now``: it gets ``now`` and is marked coalesced (its gaps are not timed)."""
        if st.buf:
            chunk, st.buf = st.buf + chunk, b""
        # The usual read while streaming: one whole token event, b'data: {...}\n\n'. It is timed
        # here, without splitting or parsing anything (the hot path: once per token).
        if chunk[:7] == b"data: {" and chunk.find(b"\n\n") == len(chunk) - 2:
            kind = token_piece(chunk[6:-2], self._piece_key)
            if kind is not None:
                if st.text is not None:
                    self._keep_text(chunk[6:-2], st)
                times = st.times
                if st.first is None:
                    st.first = now
                if not exact:
                    st.coalesced.append(len(times))
                times.append(now)
                if kind == REASONING:
                    st.reasoning += 1
                return False
        if b"\r" in chunk:  # events end with a blank line: \n\n, or \r\n\r\n from some proxies
            chunk = chunk.replace(b"\r\n", b"\n")
        if b"\n\n" not in chunk:
            st.buf = chunk
            if len(chunk) > MAX_EVENT_BYTES:
                st.error = f"an SSE event grew past {MAX_EVENT_BYTES >> 20} MiB without its blank line"
                st.done = True
            return st.done
        *events, rest = chunk.split(b"\n\n")
        st.buf = rest
        last = len(events) - 1
        for i, ev in enumerate(events):
            self.event(ev, now, st, exact and i == last and not rest)
            if st.done:
                return True
        return False

    def _keep_text(self, payload: bytes, st: Stream) -> None:
        """A plain token chunk's text, for a stream that keeps it (parsed: a conversation's turns only)."""
        assert st.text is not None
        try:
            obj = json.loads(payload)
            ch = obj["choices"][0]
            piece = ch.get("text") if self.api == "openai-completions" else ch["delta"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return
        if isinstance(piece, str):
            st.text.append(piece)

    def event(self, event: bytes, now: float, st: Stream, exact: bool = True) -> None:
        if event.startswith(b"data: ") and b"\n" not in event:
            lines: Any = (event,)  # the usual event: one data line
        else:
            lines = event.splitlines()
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # ": ping" comments, event:/id: fields
            payload = line[5:].strip()
            if payload == b"[DONE]":
                st.done = True
                return
            kind = token_piece(payload, self._piece_key)
            if kind is not None:  # a plain token chunk, judged without parsing it (see token_piece)
                if st.text is not None:
                    self._keep_text(payload, st)
                if st.first is None:
                    st.first = now
                if not exact:
                    st.coalesced.append(len(st.times))
                exact = False  # a second token in one event: same bytes, no time of its own
                st.times.append(now)
                if kind == REASONING:
                    st.reasoning += 1
                continue  # (its finish_reason, if any, does not matter: a stream with a token is not empty)
            n = len(st.times)
            self._parse(payload, now, st)
            if len(st.times) > n:
                if not exact:
                    st.coalesced.append(n)
                exact = False
            if st.error is not None:
                return

    def _parse(self, payload: bytes, now: float, st: Stream) -> None:
        try:
            obj = json.loads(payload)
        except ValueError:
            st.error = f"garbage in the stream: {payload[:80]!r}"
            st.done = True
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj:
            e = obj["error"]
            st.error = str(e.get("message", e) if isinstance(e, dict) else e)
            st.done = True
            return
        timings = obj.get("timings")  # llama.cpp's llama-server: its own count of generated tokens
        if isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
            st.engine_out = timings["predicted_n"]
        if isinstance(timings, dict) and _count(timings.get("cache_n")) is not None and st.cached is None:
            st.cached = timings["cache_n"]  # llama-server: prompt tokens its slot's cache served
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                st.usage_out = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                st.usage_in = usage["prompt_tokens"]
            details = usage.get("completion_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("reasoning_tokens"), int):
                st.usage_reasoning = details["reasoning_tokens"]
            prompt_details = usage.get("prompt_tokens_details")
            if isinstance(prompt_details, dict) and _count(prompt_details.get("cached_tokens")) is not None:
                st.cached = prompt_details["cached_tokens"]
        choices = obj.get("choices") or ()
        if not isinstance(choices, list):
            return
        counted = False
        for ch in choices:
            if not isinstance(ch, dict):
                continue
            if ch.get("finish_reason") is not None:
                st.finished = True
            if counted:
                continue
            if self.api == "openai-completions":
                piece, reasoning = ch.get("text"), None
                role = False
            else:
                delta = ch.get("delta")
                if not isinstance(delta, dict):
                    continue
                piece = delta.get("content")
                reasoning = None if piece else (delta.get("reasoning_content") or delta.get("reasoning"))
                role = "role" in delta or bool(delta.get("tool_calls"))
            # An empty piece mid-stream is a token too: llama.cpp (llama-cpp-python) sends the
            # tokens that end inside a UTF-8 character as empty text and the bytes with the next
            # one. Not the role chunk (chat's first), not the final one (it has the finish_reason).
            empty_token = piece == "" and not role and ch.get("finish_reason") is None
            if st.text is not None and isinstance(piece, str):
                st.text.append(piece)
            if piece or reasoning or empty_token:
                if st.first is None:
                    st.first = now
                st.times.append(now)
                if not piece:
                    st.reasoning += 1
                counted = True


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


__all__ = ["CONTENT", "MAX_EVENT_BYTES", "REASONING", "SseAccounting", "Stream", "token_piece"]
