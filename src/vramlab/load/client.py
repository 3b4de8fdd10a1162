"""An async, streaming OpenAI-compatible client on aiohttp: one request in, one timed result out.

Times are ``time.perf_counter()`` values; the caller turns them into run-relative seconds. TTFT
and end-to-end latency are measured twice: from the actual send and from the scheduled send, so a
stalled server or a client that fell behind cannot hide its delay (coordinated omission, vLLM #54101,
GuideLLM #1048). Only the last token chunk ends the generation: a trailing usage chunk does not.

Accounting (which SSE event is a token, usage, coalesced arrivals) is sse.py's; an empty
completion (a finish_reason or ``[DONE]`` and no text) is a success with 0 tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, fields
from typing import Any, Literal

from vramlab.load.prompts import Prompt
from vramlab.load.sse import SseAccounting, Stream

Api = Literal["openai-chat", "openai-completions"]
_OOM_MARKERS = ("out of memory", "outofmemory", "cuda error: out of memory", "enginedeaderror")


@dataclass(slots=True)
class RequestResult:
    """One HTTP attempt, timed. Built once per request on the hot path: slots, not frozen (a frozen
    dataclass's __init__ costs ~4x more); nobody changes one after the client returns it."""

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
    # "usage" (the server's count), else the prompt's own ("tokenizer": counted in the target's
    # tokenizer; "estimate"; "input": the input file's); None: unknown
    prompt_tokens_source: str | None = None
    output_tokens: int | None = None  # content and reasoning together
    output_tokens_source: str | None = (
        None  # "usage" (the server's count) | "timings" (llama.cpp's) | "chunks" (counted: an estimate)
    )
    reasoning_tokens: int | None = None  # of output_tokens: usage's reasoning_tokens, else reasoning chunks
    # Indices into token_times whose time is only an upper bound: the token came in one read with
    # bytes that followed it (another event), so when it arrived is unknown (see SseAccounting.feed).
    coalesced: tuple[int, ...] = ()
    # prompt tokens the engine's prefix cache served, in its own words (usage's
    # prompt_tokens_details.cached_tokens, llama-server's timings.cache_n); None: not said
    cached_tokens: int | None = None
    # a conversation's request (the prompt's own tags) and its answer's text (what the next turn sends back)
    conversation: str | None = None
    turn: int | None = None
    tenant: str | None = None
    text: str | None = None

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
        """Every gap between two token chunks that could be timed: a gap with a coalesced end (see
        ``coalesced``) is left out, not guessed (``untimed_gaps`` counts them)."""
        t = self.token_times
        if not self.coalesced:
            return [(b - a) * 1000 for a, b in zip(t, t[1:], strict=False)]
        bad = set(self.coalesced)
        return [(t[i] - t[i - 1]) * 1000 for i in range(1, len(t)) if i not in bad and i - 1 not in bad]

    @property
    def untimed_gaps(self) -> int:
        """Gaps between token chunks whose length is unknown (an end arrived in one read with later bytes)."""
        return max(0, len(self.token_times) - 1) - len(self.itl_ms) if self.coalesced else 0

    @property
    def tpot_ms(self) -> float | None:
        # vLLM's definition: decode time over the tokens after the first.
        n = self.output_tokens or len(self.token_times)
        if self.first_token_at is None or not self.token_times or n < 2:
            return None
        return (self.token_times[-1] - self.first_token_at) * 1000 / (n - 1)


# The order OpenAIClient.send builds a RequestResult in (positionally, on the hot path): a field added,
# removed or moved fails here, on import, instead of shifting every later value into the wrong field.
RESULT_FIELDS = (
    "request_id",
    "attempt",
    "scheduled_at",
    "sent_at",
    "end_at",
    "first_token_at",
    "token_times",
    "status_code",
    "error_class",
    "error",
    "prompt_tokens",
    "prompt_tokens_source",
    "output_tokens",
    "output_tokens_source",
    "reasoning_tokens",
    "coalesced",
    "cached_tokens",
    "conversation",
    "turn",
    "tenant",
    "text",
)
if tuple(f.name for f in fields(RequestResult)) != RESULT_FIELDS:
    raise ImportError("RequestResult's fields moved: update RESULT_FIELDS and OpenAIClient.send's call")


def _classify_status(status: int, text: str) -> str:
    low = text.lower()
    if any(m in low for m in _OOM_MARKERS):
        return "oom"
    if status < 400:  # 101, 204, a redirect: an answer, but not a completion stream
        return "stream_broken"
    return "http_4xx" if status < 500 else "http_5xx"


def _short(text: str, n: int = 200) -> str:
    return " ".join(text.split())[:n]


def max_events(max_tokens: int) -> int:
    """How many token events one answer may carry before it is a runaway stream: a server sends at
    most one per token asked for (vLLM, SGLang, TGI, llama.cpp and Ollama stream a token or more a
    chunk); four times that, plus room for role and tool chunks. Without a bound, a server that
    never stops streaming grows the client's memory until the timeout."""
    return 4 * max(1, max_tokens) + 64


def _too_many(st: Stream, cap: int) -> None:
    st.error = f"more than {cap} token events for the max_tokens asked (a runaway stream)"
    st.done = True


async def _error_body(resp: Any) -> str:
    """An error answer's body on aiohttp, up to MAX_ERROR_BODY as the own client keeps (a server that
    never ends it must not fill memory until the timeout); the connection is closed if more is left."""
    from vramlab.load.h1response import MAX_ERROR_BODY

    buf = bytearray()
    while len(buf) < MAX_ERROR_BODY:
        data = await resp.content.readany()
        if not data:
            break
        buf += data
    return bytes(buf[:MAX_ERROR_BODY]).decode("utf-8", "replace")  # JSON error bodies are UTF-8


HttpClient = Literal["auto", "fast", "aiohttp"]
BODY_CACHE_BYTES = 64 << 20  # encoded request bodies kept for reuse (an input set is cycled)


def fast_path_refusal(url: str) -> str | None:
    """Why the lean client (fasthttp.py) cannot serve ``url``: None when it can (plain ``http://``,
    no credentials in the URL); aiohttp serves the rest (``https://``, user:password@)."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    if u.scheme != "http":
        return f"{u.scheme}:// needs aiohttp (the fast client speaks plain http:// only)"
    if u.username or u.password:
        return "credentials in the URL need aiohttp"
    if not u.hostname:
        return "no host in the URL"
    return None


class OpenAIClient:
    """One connection pool for the whole run, sized to the concurrency cap: vramlab's own lean HTTP/1.1
    client for ``http://`` (``http_client="auto"`` or ``"fast"``), aiohttp for the rest or when asked
    (``"aiohttp"``). Both time tokens the same way and record the same error classes; the fast path
    stamps arrivals with the kernel's receive time (fasthttp.py)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api: Api = "openai-chat",
        api_key: str | None = None,
        max_connections: int = 256,
        timeout_s: float = 60.0,
        ignore_eos: bool = False,
        http_client: HttpClient = "auto",
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
        why = fast_path_refusal(self.url)
        if http_client == "fast" and why is not None:
            raise ValueError(f"http_client fast: {why}: {_short(self.url, 120)}")
        # Which client serves this run: "fast" (fasthttp.py) or "aiohttp".
        self.http_client = "fast" if http_client != "aiohttp" and why is None else "aiohttp"
        self._session: Any = None
        self._pool: Any = None
        self._timeout: Any = None
        self._aiohttp: Any = None
        self._url: Any = None
        # The input set is small and cycled: each body is encoded once. Keyed by the prompt's value
        # (its text, token count and output length), never by its address: a freed prompt's id() is
        # reused by the next step's, which then sent the earlier step's body.
        self._bodies: dict[tuple[Prompt, int], bytes] = {}
        self._bodies_bytes = 0
        self.sse = SseAccounting(api)  # the stream's token accounting (sse.py)

    async def __aenter__(self) -> OpenAIClient:
        if self.http_client == "fast":
            from urllib.parse import urlsplit

            from vramlab.load.fasthttp import Pool
            from vramlab.load.h1response import FastHttpError, StopBody

            self._fast_errors = FastHttpError, StopBody  # (imported here once, not per request)
            u = urlsplit(self.url)
            port = u.port or 80
            host = u.hostname or ""
            host_header = (f"[{host}]" if ":" in host else host) + (f":{u.port}" if u.port else "")
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            head = [
                f"POST {path} HTTP/1.1",
                f"Host: {host_header}",
                "User-Agent: vramlab",
                "Content-Type: application/json",
                "Accept: text/event-stream",
            ]
            if self._api_key:
                head.append(f"Authorization: Bearer {self._api_key}")
            self._req_head = ("\r\n".join(head) + "\r\nContent-Length: ").encode()
            self._pool = Pool(host, port, self._max_connections)
            return self
        import aiohttp
        from yarl import URL

        self._aiohttp = aiohttp
        self._url = URL(self.url)  # parsed once, not per request
        conn = aiohttp.TCPConnector(
            limit=self._max_connections,
            limit_per_host=self._max_connections,
            keepalive_timeout=60,
            ttl_dns_cache=300,
        )
        # read_bufsize: the 64 KiB default starves long streams (vLLM #39963).
        # One deadline for the whole exchange, body included: a hung stream is a timeout, not a hang.
        self._timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self._session = aiohttp.ClientSession(
            connector=conn, read_bufsize=2**20, timeout=aiohttp.ClientTimeout(total=None)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()  # every socket, idle or mid-answer (their requests end as stream_broken)
        if self._session is not None:
            session, self._session = self._session, None
            try:
                # Seen once on aiohttp 3.14: close() waiting forever on a connection cancelled
                # mid-stream. The run's end (rollbacks!) must not wait on a socket's goodbye.
                await asyncio.wait_for(session.close(), timeout=2.0)
            except asyncio.TimeoutError:
                pass

    def body(self, prompt: Prompt, max_tokens: int) -> bytes:
        b: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.api == "openai-chat":
            b["messages"] = [
                *({"role": r, "content": c} for r, c in prompt.history),
                {"role": "user", "content": prompt.text},
            ]
        else:
            b["prompt"] = "\n\n".join([*(c for _, c in prompt.history), prompt.text])
        if self.ignore_eos:
            b["ignore_eos"] = True
        return json.dumps(b).encode()

    def _encoded(self, prompt: Prompt, max_tokens: int) -> bytes:
        """The request's bytes, from the cache when this prompt was sent before; the cache keeps at
        most BODY_CACHE_BYTES (a drill's steps each bring new prompts: the oldest go first)."""
        key = (prompt, max_tokens)
        data = self._bodies.get(key)
        if data is not None:
            return data
        body = self.body(prompt, max_tokens)
        # the fast path keeps the whole request (head and body): one send per request
        data = body if self._pool is None else self._req_head + str(len(body)).encode() + b"\r\n\r\n" + body
        if prompt.conversation is not None:
            return data  # a conversation's turn is sent once: not kept
        self._bodies[key] = data
        self._bodies_bytes += len(data)
        while self._bodies_bytes > BODY_CACHE_BYTES and len(self._bodies) > 1:
            oldest = next(iter(self._bodies))
            self._bodies_bytes -= len(self._bodies.pop(oldest))
        return data

    async def send(
        self, request_id: str, prompt: Prompt, max_tokens: int, scheduled_at: float, attempt: int = 0
    ) -> RequestResult:
        """Send one streaming request; never raises for a server or network fault (it is data)."""
        assert self._session is not None or self._pool is not None, "use `async with OpenAIClient(...)`"
        data = self._encoded(prompt, max_tokens)
        pc = time.perf_counter
        sent = pc()
        st = Stream()
        if prompt.conversation is not None:
            st.text = []  # the answer goes back into the conversation's next turn
        if self._pool is not None:
            status, err_class, err = await self._exchange_fast(data, st, sent, max_events(max_tokens))
        else:
            status, err_class, err = await self._exchange_aiohttp(data, st, max_events(max_tokens))
        if status == 200 and err_class is None:
            if st.buf.strip() and not st.done:
                self.sse.event(st.buf, pc(), st, False)  # an event the stream ended without its blank line
            if st.error is not None:
                err_class = "oom" if any(m in st.error.lower() for m in _OOM_MARKERS) else "stream_broken"
                err = _short(st.error)
            elif st.first is None and not (st.done or st.finished):
                # An empty completion (finish_reason "stop" at once, or [DONE]) is a success
                # with 0 tokens; a stream that just ends, with neither, is broken.
                err_class, err = "stream_broken", "the stream ended without a token or a finish_reason"
        if err is not None and self._api_key:
            err = err.replace(self._api_key, "***")  # a server may echo the key back; it is never stored
        end = st.times[-1] if (st.times and err_class is None) else pc()
        if st.usage_out is not None:
            out, source = st.usage_out, "usage"
        elif st.engine_out is not None and err_class is None:
            out, source = st.engine_out, "timings"  # the engine's own count, carried in its last chunk
        elif st.times or err_class is None:
            out, source = len(st.times), "chunks"  # an estimate: a chunk may carry several tokens
        else:
            out, source = None, None
        reasoning = st.usage_reasoning if st.usage_reasoning is not None else (st.reasoning or None)
        # positional, in RESULT_FIELDS' order (checked on import): keywords cost 1.1 us here, 0.4 positional
        return RequestResult(
            request_id,
            attempt,
            scheduled_at,
            sent,
            end,
            st.first,
            tuple(st.times),
            status,
            err_class,
            err,
            st.usage_in or prompt.prompt_tokens,
            "usage" if st.usage_in else prompt.tokens_source,
            out,
            source,
            reasoning,
            tuple(st.coalesced) if st.coalesced else (),
            st.cached,
            prompt.conversation,
            prompt.turn,
            prompt.tenant,
            "".join(st.text) if st.text is not None else None,
        )

    async def _exchange_fast(
        self, data: bytes, st: Stream, sent: float, cap: int
    ) -> tuple[int, str | None, str | None]:
        FastHttpError, StopBody = self._fast_errors
        feed = self.sse.feed
        times = st.times

        def sink(chunk: bytes, t: float, exact: bool) -> bool:
            feed(chunk, t, st, exact)
            if len(times) > cap:
                _too_many(st, cap)
            if st.error is not None:
                raise StopBody  # an error event or garbage: the answer ends here
            return st.done

        try:
            status, text = await self._pool.request(data, sink, sent + self.timeout_s)
        except FastHttpError as exc:
            if exc.kind == "timeout":
                return exc.status, "timeout", f"no complete answer within {self.timeout_s:g} s"
            return exc.status, exc.kind, _short(str(exc))
        if text is not None:
            return status, _classify_status(status, text), f"HTTP {status}: {_short(text)}"
        return status, None, None

    async def _exchange_aiohttp(
        self, data: bytes, st: Stream, cap: int
    ) -> tuple[int, str | None, str | None]:
        aiohttp = self._aiohttp
        status = 0
        try:
            async with self._session.post(
                self._url, data=data, headers=self._headers, timeout=self._timeout
            ) as resp:
                status = resp.status
                if status != 200:
                    text = await _error_body(resp)
                    return status, _classify_status(status, text), f"HTTP {status}: {_short(text)}"
                await self._read_stream(resp, st, cap)
        except asyncio.TimeoutError:  # aiohttp's timeouts subclass it; on 3.10 it is not the builtin
            return status, "timeout", f"no complete answer within {self.timeout_s:g} s"
        except asyncio.CancelledError:
            raise
        except aiohttp.ClientConnectorError as exc:
            return status, "connect", _short(str(exc))
        except (
            aiohttp.ClientResponseError
        ) as exc:  # aiohttp's parser refused the answer (its "400" is not the server's)
            return status, "stream_broken", _short(f"malformed HTTP response: {exc.message}")
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            return status, "stream_broken", _short(f"{type(exc).__name__}: {exc}")
        except aiohttp.ClientError as exc:
            return (
                status,
                "connect" if status == 0 else "stream_broken",
                _short(f"{type(exc).__name__}: {exc}"),
            )
        return status, None, None

    async def _read_stream(self, resp: Any, st: Stream, cap: int = 1 << 62) -> None:
        """aiohttp's body, read by read. User-space stamps: the time each read returned (on a busy
        loop, later than the bytes came)."""
        readany = resp.content.readany  # (not `async for ... iter_any()`: no iterator, no StopAsyncIteration)
        pc, feed, times = time.perf_counter, self.sse.feed, st.times
        while True:
            chunk = await readany()
            if not chunk or feed(chunk, pc(), st, True):
                return
            if len(times) > cap:
                _too_many(st, cap)
                return
