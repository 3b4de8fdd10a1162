"""An async, streaming OpenAI-compatible client on aiohttp: one request in, one timed result out.

Times are ``time.perf_counter()`` values; the caller turns them into run-relative seconds. TTFT
and end-to-end latency are measured twice: from the actual send and from the scheduled send, so a
stalled server or a client that fell behind cannot hide its delay (coordinated omission, vLLM #54101,
GuideLLM #1048). Only the last token chunk ends the generation: a trailing usage chunk does not.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from vramlab.load.prompts import Prompt

Api = Literal["openai-chat", "openai-completions"]
_OOM_MARKERS = ("out of memory", "outofmemory", "cuda error: out of memory", "enginedeaderror")


@dataclass(frozen=True)
class RequestResult:
    request_id: str
    attempt: int
    scheduled_at: float
    sent_at: float
    end_at: float
    first_token_at: float | None = None
    token_times: tuple[float, ...] = ()
    status_code: int = 0
    error_class: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error_class is None and 200 <= self.status_code < 300

    @property
    def dispatch_lag_ms(self) -> float:
        return (self.sent_at - self.scheduled_at) * 1000

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_at is None else (self.first_token_at - self.sent_at) * 1000

    @property
    def ttft_from_scheduled_ms(self) -> float | None:
        return None if self.first_token_at is None else (self.first_token_at - self.scheduled_at) * 1000

    @property
    def e2e_ms(self) -> float:
        return (self.end_at - self.sent_at) * 1000

    @property
    def e2e_from_scheduled_ms(self) -> float:
        return (self.end_at - self.scheduled_at) * 1000

    @property
    def itl_ms(self) -> list[float]:
        t = self.token_times
        return [(b - a) * 1000 for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot_ms(self) -> float | None:
        # vLLM's definition: decode time over the tokens after the first.
        n = self.output_tokens or len(self.token_times)
        if self.first_token_at is None or not self.token_times or n < 2:
            return None
        return (self.token_times[-1] - self.first_token_at) * 1000 / (n - 1)


@dataclass
class _Stream:
    first: float | None = None
    times: list[float] = field(default_factory=list)
    usage_out: int | None = None
    usage_in: int | None = None
    error: str | None = None
    done: bool = False


def _classify_status(status: int, text: str) -> str:
    low = text.lower()
    if any(m in low for m in _OOM_MARKERS):
        return "oom"
    return "http_4xx" if 400 <= status < 500 else "http_5xx"


def _token_piece(payload: bytes, key: bytes) -> bool | None:
    """Does a plain token chunk carry text? None when it is not plain: then the caller parses it.

    Parsing JSON for every token is most of the client's cost per token on long streams, and all a
    token chunk tells us is "a token arrived now". A chunk is plain when it is one JSON object with
    exactly one ``"content":`` (chat, in a delta) or ``"text":`` (completions) key and no usage or error: the
    value right after the key is then the piece, a non-empty string unless it is ``""`` or ``null``.
    Anything else (usage, errors, tool calls, several choices, garbage) takes the full parse.
    """
    if not (payload.startswith(b"{") and payload.endswith(b"}")):
        return None
    i = payload.find(key)
    if i < 0 or payload.find(key, i + 1) >= 0 or b'"usage"' in payload or b'"error"' in payload:
        return None
    if key == b'"content":' and b'"delta"' not in payload:
        return None  # chat text counts only inside a delta
    j = i + len(key)
    while payload[j:j + 1] == b" ":
        j += 1
    head = payload[j:j + 2]
    if head[:1] == b'"':
        return head != b'""'
    return False if payload.startswith(b"null", j) else None


def _short(text: str, n: int = 200) -> str:
    return " ".join(text.split())[:n]


class OpenAIClient:
    """One aiohttp session for the whole run, its pool sized to the concurrency cap."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api: Api = "openai-chat",
        api_key: str | None = None,
        max_connections: int = 256,
        timeout_s: float = 60.0,
        ignore_eos: bool = False,
    ) -> None:
        base = base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        self.url = base + ("/chat/completions" if api == "openai-chat" else "/completions")
        self.model, self.api, self.timeout_s, self.ignore_eos = model, api, timeout_s, ignore_eos
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        self._api_key = api_key
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._max_connections = max_connections
        self._session: Any = None
        self._timeout: Any = None
        self._bodies: dict[tuple[int, int], bytes] = {}  # the input set is small and cycled: encode once
        self._piece_key = b'"text":' if api == "openai-completions" else b'"content":'

    async def __aenter__(self) -> OpenAIClient:
        import aiohttp

        conn = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=self._max_connections,
                                    keepalive_timeout=60, ttl_dns_cache=300)
        # read_bufsize: the 64 KiB default starves long streams (vLLM #39963).
        # One deadline for the whole exchange, body included: a hung stream is a timeout, not a hang.
        self._timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self._session = aiohttp.ClientSession(connector=conn, read_bufsize=2**20,
                                              timeout=aiohttp.ClientTimeout(total=None))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            try:
                # Seen once on aiohttp 3.14: close() waiting forever on a connection cancelled
                # mid-stream. The run's end (rollbacks!) must not wait on a socket's goodbye.
                await asyncio.wait_for(session.close(), timeout=2.0)
            except asyncio.TimeoutError:
                pass

    def body(self, prompt: Prompt, max_tokens: int) -> bytes:
        b: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "stream": True,
                             "stream_options": {"include_usage": True}}
        if self.api == "openai-chat":
            b["messages"] = [{"role": "user", "content": prompt.text}]
        else:
            b["prompt"] = prompt.text
        if self.ignore_eos:
            b["ignore_eos"] = True
        return json.dumps(b).encode()

    async def send(self, request_id: str, prompt: Prompt, max_tokens: int, scheduled_at: float,
                   attempt: int = 0) -> RequestResult:
        """Send one streaming request; never raises for a server or network fault (it is data)."""
        import aiohttp

        assert self._session is not None, "use `async with OpenAIClient(...)`"
        key = (id(prompt), max_tokens)
        data = self._bodies.get(key)
        if data is None:
            data = self._bodies[key] = self.body(prompt, max_tokens)
        pc = time.perf_counter
        sent = pc()
        st = _Stream()
        status = 0
        err_class: str | None = None
        err: str | None = None
        try:
            async with self._session.post(self.url, data=data, headers=self._headers, timeout=self._timeout) as resp:
                status = resp.status
                if status != 200:
                    text = await resp.text(errors="replace")
                    err_class, err = _classify_status(status, text), f"HTTP {status}: {_short(text)}"
                else:
                    await self._read_stream(resp, st)
                    if st.error is not None:
                        err_class = "oom" if any(m in st.error.lower() for m in _OOM_MARKERS) else "stream_broken"
                        err = _short(st.error)
                    elif st.first is None:
                        err_class, err = "stream_broken", "the stream ended without a token"
        except asyncio.TimeoutError:  # aiohttp's timeouts subclass it; on 3.10 it is not the builtin
            err_class, err = "timeout", f"no complete answer within {self.timeout_s:g} s"
        except asyncio.CancelledError:
            raise
        except aiohttp.ClientConnectorError as exc:
            err_class, err = "connect", _short(str(exc))
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            err_class, err = "stream_broken", _short(f"{type(exc).__name__}: {exc}")
        except aiohttp.ClientError as exc:
            err_class, err = "connect" if status == 0 else "stream_broken", _short(f"{type(exc).__name__}: {exc}")
        if err is not None and self._api_key:
            err = err.replace(self._api_key, "***")  # a server may echo the key back; it is never stored
        end = st.times[-1] if (st.times and err_class is None) else pc()
        return RequestResult(
            request_id=request_id, attempt=attempt, scheduled_at=scheduled_at, sent_at=sent, end_at=end,
            first_token_at=st.first, token_times=tuple(st.times), status_code=status,
            error_class=err_class, error=err, prompt_tokens=st.usage_in or prompt.prompt_tokens,
            output_tokens=st.usage_out if st.usage_out is not None else (len(st.times) if st.times else None),
        )

    async def _read_stream(self, resp: Any, st: _Stream) -> None:
        pc = time.perf_counter
        buf = b""
        async for chunk in resp.content.iter_any():
            now = pc()
            buf += chunk
            while True:
                # Events end with a blank line; servers use \n\n, some proxies \r\n\r\n.
                i = buf.find(b"\n\n")
                j = buf.find(b"\r\n\r\n")
                if i < 0 and j < 0:
                    break
                if j >= 0 and (i < 0 or j < i):
                    event, buf = buf[:j], buf[j + 4:]
                else:
                    event, buf = buf[:i], buf[i + 2:]
                self._event(event, now, st)
                if st.done:
                    return
        if buf.strip():
            self._event(buf, pc(), st)

    def _event(self, event: bytes, now: float, st: _Stream) -> None:
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue  # ": ping" comments, event:/id: fields
            payload = line[5:].strip()
            if payload == b"[DONE]":
                st.done = True
                return
            has = _token_piece(payload, self._piece_key)
            if has is not None:  # a plain token chunk, judged without parsing it (see _token_piece)
                if has:
                    if st.first is None:
                        st.first = now
                    st.times.append(now)
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                st.error = f"garbage in the stream: {payload[:80]!r}"
                st.done = True
                return
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                e = obj["error"]
                st.error = str(e.get("message", e) if isinstance(e, dict) else e)
                st.done = True
                return
            usage = obj.get("usage")
            if isinstance(usage, dict):
                if isinstance(usage.get("completion_tokens"), int):
                    st.usage_out = usage["completion_tokens"]
                if isinstance(usage.get("prompt_tokens"), int):
                    st.usage_in = usage["prompt_tokens"]
            choices = obj.get("choices")
            for ch in choices if isinstance(choices, list) else ():
                if not isinstance(ch, dict):
                    continue  # a malformed choice is not a token (fuzzed: {"choices": [null]})
                delta = ch.get("delta")
                piece = ch.get("text") if self.api == "openai-completions" else (
                    delta.get("content") if isinstance(delta, dict) else None)
                if piece:
                    if st.first is None:
                        st.first = now
                    st.times.append(now)
                    break
