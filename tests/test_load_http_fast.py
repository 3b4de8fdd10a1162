"""vramlab's own HTTP/1.1 client (load/fasthttp.py) against a scripted loopback server: body framings,
SSE split and joined across reads, kernel receive stamps, errors, keep-alive, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable

import pytest

from vramlab.load.client import OpenAIClient, RequestResult, fast_path_refusal
from vramlab.load.kstamp import SO_TIMESTAMPNS
from vramlab.load.prompts import Prompt

P = Prompt("hello", 1, 4)
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def tok(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


FIN = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n'
DONE = b"data: [DONE]\n\n"


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
    return head + await r.readexactly(n)


class Server:
    """A loopback server running one script per request; counts connections and requests."""

    def __init__(self, script: Script, requests_per_conn: int = 100) -> None:
        self.script, self.per_conn = script, requests_per_conn
        self.conns = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> Server:
        self.srv = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.srv.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.srv.close()

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.conns += 1
        try:
            for _ in range(self.per_conn):
                self.requests.append(await read_request(r))
                await self.script(r, w)
                if w.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


async def one(script: Script, timeout_s: float = 5.0, n: int = 1) -> tuple[list[RequestResult], Server]:
    async with (
        Server(script) as srv,
        OpenAIClient(srv.url, "m", http_client="fast", timeout_s=timeout_s) as c,
    ):
        assert c.http_client == "fast"
        out = [await c.send(str(i), P, 4, time.perf_counter()) for i in range(n)]
        return out, srv


def run(script: Script, **kw: object) -> tuple[list[RequestResult], Server]:
    return asyncio.run(one(script, **kw))  # type: ignore[arg-type]


def test_chunked_stream_with_events_split_and_joined_across_reads() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(HEAD_CHUNKED)
        t1 = tok("a")
        w.write(chunk(t1[:9]))  # one event split over two chunks and two reads
        await w.drain()
        await asyncio.sleep(0.03)
        w.write(chunk(t1[9:]))
        await w.drain()
        await asyncio.sleep(0.03)
        w.write(chunk(tok("b") + tok("c")))  # two events in one chunk: one read, b's time unknown
        await w.drain()
        await asyncio.sleep(0.03)
        w.write(chunk(tok("d")))
        await w.drain()
        await asyncio.sleep(0.03)
        w.write(chunk(FIN + USAGE % 4 + DONE) + b"0\r\n\r\n")
        await w.drain()

    (res,), srv = run(script)
    assert (
        res.ok
        and res.output_tokens == 4
        and res.output_tokens_source == "usage"
        and len(res.token_times) == 4
    )
    assert res.coalesced == (1,)  # b came with c: its arrival is c's stamp, an upper bound
    assert res.untimed_gaps == 2 and len(res.itl_ms) == 1  # a-b and b-c untimed; c-d timed
    assert 20 <= res.itl_ms[0] <= 200
    req = srv.requests[0]
    assert req.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and b"\r\nHost: 127.0.0.1:" in req
    assert json.loads(req.split(b"\r\n\r\n", 1)[1])["stream"] is True


@pytest.mark.parametrize("framing", ["length", "close"])
def test_content_length_and_close_delimited_bodies(framing: str) -> None:
    body = tok("x") + tok("y") + FIN + USAGE % 2 + DONE

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if framing == "length":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        else:
            w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + body)
            await w.drain()
            w.close()
        await w.drain()

    results, srv = run(script, n=2)
    assert all(r.ok and r.output_tokens == 2 and len(r.token_times) == 2 for r in results)
    assert srv.conns == (1 if framing == "length" else 2)  # keep-alive kept, or a new connection after close


def test_http_error_keeps_the_servers_words_and_the_connection() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        text = b'{"error":{"message":"CUDA out of memory. Tried to allocate 2 GiB"}}'
        w.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))
        await w.drain()

    results, srv = run(script, n=2)
    assert all(r.status_code == 500 and r.error_class == "oom" for r in results)
    assert (
        results[0].error is not None
        and results[0].error.startswith("HTTP 500: ")
        and "Tried to allocate" in results[0].error
    )
    assert srv.conns == 1


def test_chunked_error_status_and_4xx() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(
            b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk(b"rate limit")
            + chunk(b" exceeded")
            + b"0\r\n\r\n"
        )
        await w.drain()

    (res,), _ = run(script)
    assert res.error_class == "http_4xx" and res.error == "HTTP 429: rate limit exceeded"


def test_server_closing_mid_stream_is_a_broken_stream() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(HEAD_CHUNKED + chunk(tok("a")))
        await w.drain()
        await asyncio.sleep(0.02)
        w.close()

    (res,), _ = run(script)
    assert res.status_code == 200 and res.error_class == "stream_broken" and "mid-answer" in (res.error or "")
    assert len(res.token_times) == 1


def test_malformed_response_is_a_broken_stream() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"SPDY/9 what\r\n\r\n")
        await w.drain()

    (res,), _ = run(script)
    assert res.error_class == "stream_broken" and "malformed HTTP response" in (res.error or "")


def test_a_keep_alive_connection_the_server_closed_is_replaced_not_failed() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        body = tok("x") + USAGE % 1 + DONE
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await w.drain()

    async def go() -> tuple[list[RequestResult], Server]:
        async with (
            Server(script, requests_per_conn=1) as srv,
            OpenAIClient(srv.url, "m", http_client="fast") as c,
        ):
            out = []
            for i in range(3):
                out.append(await c.send(str(i), P, 4, time.perf_counter()))
                await asyncio.sleep(0.05)  # the server closes the idle connection meanwhile
            return out, srv

    results, srv = asyncio.run(go())
    assert all(r.ok for r in results) and srv.conns == 3


def test_timeout_while_the_server_says_nothing() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3)

    (res,), _ = run(script, timeout_s=0.3)
    assert res.error_class == "timeout" and 250 <= res.e2e_ms <= 2000


def test_each_request_times_out_at_its_own_deadline_behind_one_timer() -> None:
    """The pool keeps every answer's deadline behind one loop timer: a deadline registered after a
    later one still fires on time, answered requests leave the heap, and the heap stays bounded."""
    from vramlab.load.fasthttp import Pool
    from vramlab.load.h1response import FastHttpError

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if b"silent" in srv_requests[-1]:
            await release.wait()  # says nothing until the test is over, then closes its connection
            w.close()
            return
        body = DONE
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()

    srv_requests: list[bytes] = []
    release = asyncio.Event()

    def req(path: str) -> bytes:
        return f"POST /{path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()

    async def go() -> tuple[list[float], int, int, bool]:
        async with Server(script) as srv:
            srv.requests = srv_requests
            host, port = srv.url.removeprefix("http://").split(":")
            pool = Pool(host, int(port), limit=4)

            async def timed(deadline: float) -> float:
                try:
                    await pool.request(req("silent"), lambda b, t, e: False, deadline)
                except FastHttpError as exc:
                    assert exc.kind == "timeout"
                return time.perf_counter()

            t0 = time.perf_counter()
            late = asyncio.ensure_future(timed(t0 + 0.8))  # registered first, due last
            await asyncio.sleep(0.05)
            early = asyncio.ensure_future(timed(t0 + 0.3))
            answered = 0
            peak = 0
            for _ in range(200):  # answered requests on the two free connections meanwhile
                status, _ = await pool.request(req("ok"), lambda b, t, e: True, time.perf_counter() + 60)
                answered += status == 200
                peak = max(peak, len(pool.deadlines))
            ends = [await early - t0, await late - t0]
            left = len(pool.deadlines)
            pool.close()
            release.set()  # the server's silent handlers end and close their sockets before the loop does
            await asyncio.sleep(0.05)
            return ends, answered, peak, left <= 2 * 4 + 65 and pool.timer is None

    ends, answered, peak, tidy = asyncio.run(go())
    assert answered == 200
    # the earlier deadline did not wait for the later one's timer (due at 0.8 s: the room before it
    # is for a busy machine)
    assert 0.28 <= ends[0] < 0.78, ends
    assert 0.78 <= ends[1] < 2.0, ends
    assert peak <= 2 * 4 + 65, peak  # answered requests' entries are dropped, not kept for 60 s
    assert tidy


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_cancelled_requests_and_closing_leak_no_sockets() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(HEAD_CHUNKED)
        for _ in range(100):
            w.write(chunk(tok("a")))
            await w.drain()
            await asyncio.sleep(0.01)

    async def go() -> tuple[int, int, int]:
        async with Server(script) as srv:
            gc.collect()  # an earlier test's unreachable sockets close now, not in the middle of the count
            before = _fds()
            async with OpenAIClient(srv.url, "m", http_client="fast", max_connections=8) as c:
                tasks = [asyncio.ensure_future(c.send(str(i), P, 4, time.perf_counter())) for i in range(20)]
                await asyncio.sleep(0.2)  # 8 streaming, 12 waiting for a connection
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                assert all(t.cancelled() for t in tasks)
                during = len(c._pool.all)
                # the pool still works after the cancellations
                fresh = asyncio.ensure_future(c.send("z", P, 4, time.perf_counter()))
                await asyncio.sleep(0.1)
                fresh.cancel()
                await asyncio.gather(fresh, return_exceptions=True)
            await asyncio.sleep(0.05)
            return before, during, _fds()

    before, during, after = asyncio.run(go())
    assert during == 0 and after == before


@pytest.mark.skipif(SO_TIMESTAMPNS is None, reason="no SO_TIMESTAMPNS here: read-time stamps")
def test_kernel_stamps_time_tokens_that_a_busy_client_read_late() -> None:
    """The client's loop is blocked for 0.4 s while three tokens arrive 20 ms apart: it reads them
    together. Their kernel stamp is the last one's arrival (~0.14 s), not the read (~0.4 s); the
    first two are marked coalesced; the later tokens, read one by one, are timed exactly."""
    import threading

    lsock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:  # a thread: the client's loop is about to block, the server must not
        conn, _ = lsock.accept()
        with conn:
            for n in range(2):
                buf = b""
                while b"\r\n\r\n" not in buf or not buf.endswith(b"}"):
                    buf += conn.recv(65536)
                conn.sendall(HEAD_CHUNKED)
                steps = (
                    ((0.0, "w"),)
                    if n == 0
                    else ((0.10, "a"), (0.02, "b"), (0.02, "c"), (0.40, "d"), (0.05, "e"))
                )
                for delay, text in steps:
                    time.sleep(delay)
                    conn.sendall(chunk(tok(text)))
                time.sleep(0.05)
                conn.sendall(chunk(FIN + USAGE % len(steps) + DONE) + b"0\r\n\r\n")
            time.sleep(0.2)

    th = threading.Thread(target=serve, daemon=True)
    th.start()

    async def go() -> RequestResult:
        url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
        async with OpenAIClient(url, "m", http_client="fast") as c:
            await c.send("warm", P, 4, time.perf_counter())  # connected: the next request's timing is clean
            loop = asyncio.get_running_loop()
            loop.call_soon(time.sleep, 0.4)  # right after the send, the client's core is busy for 0.4 s
            return await c.send("x", P, 4, time.perf_counter())

    res = asyncio.run(go())
    assert res.ok and len(res.token_times) == 5
    assert res.coalesced[:2] == (0, 1)  # a and b came in c's read
    assert (
        res.ttft_ms is not None and res.ttft_ms < 330
    )  # c's arrival (~140 ms), not the late read (>= 400 ms)
    t = res.token_times
    assert (
        t[3] - t[2]
    ) * 1000 > 300  # c -> d: the server's real gap (~400 ms), not the ~150 ms after the read
    assert 2 not in res.coalesced and 3 not in res.coalesced
    th.join(2)
    lsock.close()


def test_https_and_credentials_stay_on_aiohttp() -> None:
    assert fast_path_refusal("http://127.0.0.1:8000/v1/chat/completions") is None
    assert fast_path_refusal("https://example.com/v1/chat/completions") is not None
    assert fast_path_refusal("http://u:p@127.0.0.1:8000/v1/completions") is not None
    assert OpenAIClient("https://example.com", "m").http_client == "aiohttp"
    assert OpenAIClient("http://127.0.0.1:1", "m").http_client == "fast"
    assert OpenAIClient("http://127.0.0.1:1", "m", http_client="aiohttp").http_client == "aiohttp"
    with pytest.raises(ValueError, match="https"):
        OpenAIClient("https://example.com", "m", http_client="fast")


def test_ipv6_loopback_and_a_path_prefix() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")

    async def go() -> tuple[RequestResult, bytes]:
        seen: list[bytes] = []

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            seen.append(await read_request(r))
            body = tok("x") + DONE
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await w.drain()
            w.close()

        try:
            srv = await asyncio.start_server(handle, "::1", 0)
        except OSError:
            pytest.skip("no IPv6 loopback")
        port = srv.sockets[0].getsockname()[1]
        async with srv, OpenAIClient(f"http://[::1]:{port}/proxy", "m", http_client="fast") as c:
            res = await c.send("x", P, 4, time.perf_counter())
        return res, seen[0]

    res, req = asyncio.run(go())
    assert res.ok and req.startswith(b"POST /proxy/v1/chat/completions HTTP/1.1") and b"Host: [::1]:" in req


def test_clock_follows_wall_clock_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wall clock (the kernel stamps' clock) is stepped by 1.5 ms while data waits to be read:
    a stamp from before the step converts with the offset of before, one after with the new one."""
    from vramlab.load import kstamp

    now = [100.0]  # perf_counter
    wall = [1_000_000.0]  # time.time() - perf_counter() before the step

    monkeypatch.setattr(kstamp.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(kstamp.time, "time", lambda: now[0] + wall[0])
    monkeypatch.setattr(kstamp.time, "time_ns", lambda: int((now[0] + wall[0]) * 1e9))
    clock = kstamp.Clock()

    def stamp(perf: float, off: float) -> tuple[int, int]:
        ns = round((perf + off) * 1e9)
        return ns // 10**9, ns % 10**9

    now[0] = 100.010
    assert clock.to_perf(*stamp(100.005, wall[0])) == pytest.approx(100.005, abs=1e-6)
    before = wall[0]
    wall[0] += 0.0015  # stepped at 100.020
    now[0] = 100.030
    # arrived at 100.015 (stamped with the old offset), read at 100.030, after the step
    assert clock.to_perf(*stamp(100.015, before)) == pytest.approx(100.015, abs=1e-6)
    assert clock.step_at == 100.030 and len(clock.steps) == 2
    # arrived after the step
    now[0] = 100.040
    assert clock.to_perf(*stamp(100.035, wall[0])) == pytest.approx(100.035, abs=1e-6)
    # a stamp in the future (cannot be): the read's time
    assert clock.to_perf(*stamp(100.5, wall[0])) == pytest.approx(100.040, abs=1e-6)


def test_plan_switch_refuses_fast_for_https() -> None:
    from pathlib import Path

    from vramlab.experiment.plan import parse_plan

    text = (Path(__file__).resolve().parents[1] / "examples" / "concurrency-ramp.yaml").read_text()
    text = text.replace("  kind: sim\n", "  base_url: URL\n").replace(
        "  sim: {gpu: h100-80gb, engine: vllm, speed: 20, max_model_len: 8192, seed: 7}\n", ""
    )
    text = text.replace("  request_timeout_s: 30\n", "  request_timeout_s: 30\n  http_client: VIA\n")
    text = text.replace("sources: [ledger, engine, host, health]", "sources: [host]")

    def plan(url: str, via: str) -> object:
        return parse_plan(text.replace("URL", url).replace("VIA", via))

    assert plan("http://127.0.0.1:8000", "fast").load.http_client == "fast"  # type: ignore[attr-defined]
    assert plan("https://example.com", "auto").load.http_client == "auto"  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="http_client: fast, but https:// needs aiohttp"):
        plan("https://example.com", "fast")


def test_chunked_decoder_over_random_reads() -> None:
    """Whatever the reads look like (one chunk each: the shortcut; split or joined: the full
    decoder), the sink gets the body's bytes in order, exactly once, and the answer ends at the
    terminal chunk with the connection reusable."""
    import random

    from vramlab.load.h1response import Response

    class Pool:
        def __init__(self) -> None:
            self.released: list[bool] = []

        def release(self, conn: object, reusable: bool) -> None:
            self.released.append(reusable)

        def drop(self, conn: object) -> None:
            self.released.append(False)

    class Conn:
        def __init__(self) -> None:
            self.pool, self.reused, self.resp = Pool(), False, None

    rng = random.Random(15)
    loop = asyncio.new_event_loop()
    try:
        for trial in range(300):
            events = [tok(f"t{i}") for i in range(rng.randint(1, 6))] + [FIN, USAGE % 3, DONE]
            chunks = [chunk(e) for e in events]
            if trial % 3 == 0:  # some servers use chunk extensions and upper-case hex
                chunks = [b"%X;ext=1\r\n%s\r\n" % (len(e), e) for e in events]
            raw = HEAD_CHUNKED + b"".join(chunks) + b"0\r\n\r\n"
            if trial % 2:
                reads = [HEAD_CHUNKED, *chunks, b"0\r\n\r\n"]
            else:
                cuts = sorted(set(rng.sample(range(1, len(raw)), rng.randint(1, 8))))
                reads = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=False)]
            got: list[bytes] = []
            conn = Conn()
            fut = loop.create_future()
            resp = Response(conn, fut, lambda d, t, exact, got=got: got.append(d) or False)  # type: ignore[arg-type, misc]
            conn.resp = resp  # type: ignore[assignment]
            for r in reads:
                resp.feed(r, 0.0)
            assert fut.done() and fut.result() == (200, None), (trial, reads)
            assert b"".join(got) == b"".join(events), trial
            assert conn.pool.released == [True], trial
    finally:
        loop.close()


def test_closing_the_client_ends_requests_in_flight() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(HEAD_CHUNKED + chunk(tok("a")))
        await w.drain()
        await asyncio.sleep(5)

    async def go() -> tuple[RequestResult, float]:
        async with Server(script) as srv:
            c = OpenAIClient(srv.url, "m", http_client="fast", timeout_s=30)
            await c.__aenter__()
            t = time.perf_counter()
            task = asyncio.ensure_future(c.send("x", P, 4, t))
            await asyncio.sleep(0.2)
            await c.__aexit__(None, None, None)
            res = await asyncio.wait_for(task, 5)
            return res, time.perf_counter() - t

    res, took = asyncio.run(go())
    assert res.error_class == "stream_broken" and "closed mid-answer" in (res.error or "") and took < 3


def test_a_name_that_resolves_to_a_dead_address_first_still_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    """`localhost` may resolve to ::1 first while the server listens on 127.0.0.1 only: every resolved
    address is tried in turn (as aiohttp's connector does), and the one that answered is kept."""
    calls: list[str] = []

    async def go() -> list[RequestResult]:
        async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            body = tok("x") + DONE
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await w.drain()

        async with Server(script) as srv:
            port = int(srv.url.rsplit(":", 1)[1])
            dead = socket.socket()
            dead.bind(("127.0.0.1", 0))  # bound, never listening: connecting to it is refused
            dead_addr = dead.getsockname()
            loop = asyncio.get_running_loop()

            async def resolve(host: str, p: int, **kw: object) -> list[tuple[object, ...]]:
                calls.append(host)
                return [
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", dead_addr),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
                ]

            monkeypatch.setattr(loop, "getaddrinfo", resolve)
            try:
                async with OpenAIClient(
                    f"http://server.test:{port}", "m", http_client="fast", max_connections=1
                ) as c:
                    return [await c.send(str(i), P, 4, time.perf_counter()) for i in range(3)]
            finally:
                dead.close()

    results = asyncio.run(go())
    assert all(r.ok for r in results), [r.error for r in results]
    assert calls == ["server.test"]  # resolved once; the address that answered is reused


def test_the_framing_never_raises_on_junk() -> None:
    """Whatever bytes a server sends, split however, feed() never raises: the answer ends (a result
    or a classified error) or waits for more, and the server's close ends it."""
    from hypothesis import given, settings
    from hypothesis import strategies as hs

    from vramlab.load.h1response import FastHttpError, Response

    class Pool:
        def release(self, conn: object, reusable: bool) -> None:
            pass

        def drop(self, conn: object) -> None:
            pass

    class Conn:
        def __init__(self) -> None:
            self.pool, self.reused, self.resp = Pool(), False, None

    pieces = hs.sampled_from(
        [
            HEAD_CHUNKED,
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n",
            b"Content-Length: 5\r\n",
            b"\r\n",
            b"-2\r\n",
            b"ffffffffffffffffffff\r\n",
            b"5\r\n",
            b"hello",
            b"0\r\n\r\n",
            chunk(tok("a")),
            tok("b"),
            b"X: y\r\n",
            b"HTTP/1.0 500 x\r\n",
        ]
    )
    junk = hs.lists(hs.one_of(pieces, hs.binary(max_size=40)), max_size=12)

    @settings(max_examples=300, deadline=None)
    @given(junk, hs.lists(hs.integers(1, 60), max_size=6))
    def check(parts: list[bytes], cuts: list[int]) -> None:
        raw = b"".join(parts)
        loop = asyncio.new_event_loop()
        try:
            conn = Conn()
            fut = loop.create_future()
            resp = Response(conn, fut, lambda d, t, exact: False)  # type: ignore[arg-type]
            conn.resp = resp  # type: ignore[assignment]
            pos = 0
            for c in [*cuts, len(raw)]:
                if fut.done() or pos >= len(raw):
                    break
                resp.feed(raw[pos : pos + c], 0.0)
                pos += c
            if not fut.done():
                resp.feed(b"", 0.0)  # the server closes: every answer ends
            assert fut.done()
            exc = fut.exception()
            assert exc is None or isinstance(exc, FastHttpError), exc
        finally:
            loop.close()

    check()
