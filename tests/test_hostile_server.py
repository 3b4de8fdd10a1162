"""A server that answers badly on purpose, against both load clients (vramlab's own HTTP/1.1 client,
`http_client: fast`, and aiohttp): every malformed or hostile answer ends its request with a
classified error, within the request's timeout, without a traceback and without the client's
memory growing with what the server sends; `vramlab run` against one ends within its wall clock.

(A server's own flood ends sooner than the timeout where a bound says so: see docs/experiments.md.)
The server is raw asyncio on 127.0.0.1 in its own thread (its own event loop, so a client that
spins cannot starve it, and one that hangs cannot hide behind it). ``/health`` answers 200; every
POST gets the case's script.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from vramlab.load.client import OpenAIClient, RequestResult
from vramlab.load.prompts import Prompt

P = Prompt("hello", 1, 4)
TIMEOUT_S = 1.5
SLACK_S = 1.5  # scheduling on a busy 2-core machine; a hang is seconds past this
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def tok(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


DONE = b"data: [DONE]\n\n"
HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FLOOD_CAP = 256 << 20  # what a flooding script sends at most (a client that buffered it all would show)


async def _flood(w: asyncio.StreamWriter, piece: bytes, every_s: float = 0.0) -> None:
    """Write ``piece`` over and over, as fast as the client reads it (or every ``every_s``)."""
    sent = 0
    while sent < FLOOD_CAP:
        w.write(piece * (1 if every_s else max(1, 16384 // len(piece))))
        sent += len(piece)
        await w.drain()
        if every_s:
            await asyncio.sleep(every_s)


def _reset(w: asyncio.StreamWriter) -> None:
    sock = w.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
    w.transport.abort()


async def negative_chunk(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(
        HEAD_CHUNKED + b"-2\r\nhello\r\n0\r\n\r\n"
    )  # the first client took -2 as a size and read backwards
    await w.drain()
    await asyncio.sleep(30)


async def huge_chunk(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD_CHUNKED + b"1" + b"0" * 40 + b"\r\n" + tok("a"))  # 16**40: past any integer
    await _flood(w, tok("b"))


async def bad_hex_chunk(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD_CHUNKED + chunk(tok("a")) + b"zz\r\n" + tok("b") + b"\r\n0\r\n\r\n")
    await w.drain()
    await asyncio.sleep(30)


async def continue_flood(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await _flood(w, b"HTTP/1.1 100 Continue\r\n\r\n")


async def endless_headers(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
    await _flood(w, b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n")


async def endless_header_line(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nX-Filler: ")
    await _flood(w, b"a" * 1024)


async def endless_trailers(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD_CHUNKED + chunk(tok("a")) + b"0\r\n")
    await _flood(w, b"X-Trailer: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\r\n")


async def past_content_length(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    body = tok("a") + tok("b") + DONE
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n" + body)
    await w.drain()
    await asyncio.sleep(30)


async def reset_mid_stream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD_CHUNKED + chunk(tok("a")))
    await w.drain()
    await asyncio.sleep(0.05)
    _reset(w)


async def reset_before_answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    _reset(w)


async def never_ending_stream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD_CHUNKED + chunk(tok("t")))
    await _flood(w, chunk(b": ping\n\n"), every_s=0.005)  # alive, never done


async def token_flood(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD_CHUNKED)
    await _flood(w, chunk(tok("t")))  # tokens as fast as the client reads, far past the 4 asked for


async def never_ending_line(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD_CHUNKED + chunk(b"data: "))
    await _flood(w, chunk(b"x" * 4096))  # one SSE event that never ends


async def never_ending_error_body(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n")
    await _flood(w, chunk(b"e" * 4096))


async def silence(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)


async def slow_head(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    await _flood(w, b"a", every_s=0.05)  # one byte every 50 ms: never a whole head in time


async def garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await _flood(w, bytes(range(256)))


async def switching_protocols(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    await _flood(w, b"\x81\x05hello")


async def stream_after_done(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD_CHUNKED + chunk(tok("a") + DONE))
    await _flood(w, chunk(b": keep talking\n\n"), every_s=0.01)


# case -> the error classes either client may give (its own words differ; the class must be one of these)
CASES: dict[str, tuple[Script, set[str]]] = {
    "negative_chunk": (negative_chunk, {"stream_broken"}),
    "huge_chunk": (huge_chunk, {"stream_broken"}),
    "bad_hex_chunk": (bad_hex_chunk, {"stream_broken"}),
    "continue_flood": (continue_flood, {"stream_broken", "timeout"}),
    "endless_headers": (endless_headers, {"stream_broken"}),
    "endless_header_line": (endless_header_line, {"stream_broken"}),
    "endless_trailers": (endless_trailers, {"stream_broken"}),
    "past_content_length": (past_content_length, {"stream_broken"}),
    "reset_mid_stream": (reset_mid_stream, {"stream_broken"}),
    "reset_before_answer": (reset_before_answer, {"stream_broken", "connect"}),
    "never_ending_stream": (never_ending_stream, {"timeout"}),
    "never_ending_line": (never_ending_line, {"stream_broken", "timeout"}),
    "token_flood": (token_flood, {"stream_broken"}),
    "never_ending_error_body": (never_ending_error_body, {"http_5xx", "timeout"}),
    "silence": (silence, {"timeout"}),
    "slow_head": (slow_head, {"timeout"}),
    "garbage": (garbage, {"stream_broken"}),
    "switching_protocols": (switching_protocols, {"stream_broken"}),
}


class HostileServer:
    """A loopback HTTP server in its own thread: ``/health`` answers 200, a POST runs the script."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.posts = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _serve(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            srv = await asyncio.start_server(self._conn, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
            self._ready.set()
            async with srv:
                await self._stop.wait()

        asyncio.run(main())

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                await r.readexactly(n)
                if head.startswith(b"GET"):
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await w.drain()
                    continue
                self.posts += 1
                await self.script(r, w)
                return
        except (
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.LimitOverrunError,
            asyncio.CancelledError,
        ):
            pass
        finally:
            w.close()


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _send_one(url: str, http_client: str) -> tuple[RequestResult, float, list[str], str]:
    loop = asyncio.get_running_loop()
    loop_errors: list[str] = []  # an exception in a reader callback is logged here, not raised to send()
    loop.set_exception_handler(
        lambda _loop, ctx: loop_errors.append(str(ctx.get("exception") or ctx["message"]))
    )
    async with OpenAIClient(url, "m", http_client=http_client, timeout_s=TIMEOUT_S) as c:  # type: ignore[arg-type]
        t = time.perf_counter()
        res = await asyncio.wait_for(c.send("0", P, 4, t), TIMEOUT_S + 30)
        return res, time.perf_counter() - t, loop_errors, c.http_client


@pytest.mark.parametrize("http_client", ["fast", "aiohttp"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_answer_ends_its_request_classified_and_in_time(case: str, http_client: str) -> None:
    script, classes = CASES[case]
    rss = _maxrss_mib()
    with HostileServer(script) as srv:
        res, took, loop_errors, used = asyncio.run(_send_one(srv.url, http_client))
    assert used == http_client
    grew = _maxrss_mib() - rss
    print(
        f"{case} on {http_client}: {res.error_class} in {took:.2f} s ({res.error}); peak RSS +{grew:.0f} MiB"
    )
    assert res.error_class in classes, (res.error_class, res.error)
    assert res.error and "Traceback" not in res.error
    assert took < TIMEOUT_S + SLACK_S, took
    assert not loop_errors, loop_errors
    assert grew < 128, f"peak RSS grew {grew:.0f} MiB"


def test_the_fast_client_names_what_was_wrong() -> None:
    """The own client's words say which rule the answer broke (one line each, no parser internals)."""
    want = {
        "negative_chunk": "chunk size",
        "continue_flood": "interim (1xx)",
        "endless_headers": "without a byte of body",
        "endless_trailers": "without a byte of body",
        "past_content_length": "after the answer's end",
        "switching_protocols": "switched protocols",
        "huge_chunk": "chunk size",
    }
    for case, words in want.items():
        with HostileServer(CASES[case][0]) as srv:
            res, _, _, _ = asyncio.run(_send_one(srv.url, "fast"))
        assert res.error and "malformed HTTP response" in res.error and words.lower() in res.error.lower(), (
            case,
            res.error,
        )


def test_auto_picks_the_fast_client_and_a_stream_after_done_keeps_its_answer() -> None:
    """``auto`` serves http:// with the own client; a server that keeps talking after ``[DONE]``
    does not turn a finished answer into a timeout (the connection is closed instead)."""
    with HostileServer(stream_after_done) as srv:
        for client in ("auto", "aiohttp"):
            res, took, errors, used = asyncio.run(_send_one(srv.url, client))
            assert used == ("fast" if client == "auto" else "aiohttp")
            assert res.ok and len(res.token_times) == 1 and took < 1.0 and not errors, (
                client,
                res.error,
                took,
            )


def test_a_closed_port_is_a_connect_error_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        for client in ("fast", "aiohttp"):
            res, took, errors, _ = asyncio.run(_send_one(f"http://127.0.0.1:{port}", client))
            assert res.error_class == "connect" and took < 1.0 and not errors, (client, res.error, took)


# -- through the installed CLI -----------------------------------------------------------------------
def _plan(path: Path, url: str, http_client: str, stops: str) -> Path:
    path.write_text(f"""\
name: hostile
target: {{base_url: "{url}", model: m}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 2, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: [4]}}
phases: {{duration_s: 30, drain_s: 0.5}}
rounds: 1
load: {{http_client: {http_client}, request_timeout_s: 2}}
stop_conditions: {stops}
samplers: {{interval_s: 0.5, sources: [host]}}
""")
    return path


def _vramlab(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run(["vramlab", *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("http_client", ["auto", "aiohttp"])
def test_vramlab_run_against_a_negative_chunk_size_ends_within_its_wall_clock(
    tmp_path: Path, http_client: str
) -> None:
    """No error-rate stop: only the wall clock (6 s) can end this run. It must, exit 3 (stopped by
    a stop condition), with every request stored as a classified error and no traceback. (The wall
    clock counts the run's start-up too: on a busy machine that took 3 s, and a 3 s clock sent nothing.)"""
    with HostileServer(negative_chunk) as srv:
        plan = _plan(tmp_path / "p.yaml", srv.url, http_client, "{error_rate: null, wall_clock_s: 6}")
        t = time.monotonic()
        res = _vramlab("run", str(plan), "--db", str(tmp_path / "v.db"), "--json", timeout=60)
        took = time.monotonic() - t
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 3, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["status"] == "stopped" and out["stop_condition"] == "wall_clock_s"
    assert out["requests"] > 0 and out["errors"] == out["requests"]
    assert took < 6 + 15, took  # the wall clock, plus the process's own exit and a busy machine
    import sqlite3

    con = sqlite3.connect(tmp_path / "v.db")
    classes = {c for (c,) in con.execute("SELECT DISTINCT error_class FROM requests")}
    con.close()
    assert classes <= {"stream_broken", "cancelled"} and "stream_broken" in classes, classes


def test_vramlab_run_against_a_continue_flood_stops_on_its_error_rate(tmp_path: Path) -> None:
    with HostileServer(continue_flood) as srv:
        plan = _plan(
            tmp_path / "p.yaml",
            srv.url,
            "fast",
            "{error_rate: 0.5, window_s: 5, min_requests: 4, wall_clock_s: 20}",
        )
        res = _vramlab("run", str(plan), "--db", str(tmp_path / "v.db"), "--json", timeout=60)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 3, res.stdout + res.stderr
    out = json.loads(res.stdout)
    # the error rate, not the 20 s wall clock, ended it (how soon is the machine's: 18.7 s once on a busy one)
    assert out["stop_condition"] == "error_rate" and out["elapsed_s"] < 20, out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # free again once closed: nothing listens there


def test_vramlab_run_and_drill_against_a_closed_port_end_in_time(tmp_path: Path) -> None:
    """A run refuses at once (nothing answers: bad input, exit 2, nothing stored); a drill, whose
    target may still be starting, waits for it no longer than its own wall clock."""
    url = f"http://127.0.0.1:{_closed_port()}"
    t = time.monotonic()
    res = _vramlab(
        "run",
        str(_plan(tmp_path / "p.yaml", url, "auto", "{wall_clock_s: 3}")),
        "--db",
        str(tmp_path / "v.db"),
        timeout=60,
    )
    assert res.returncode == 2 and "not reachable" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert time.monotonic() - t < 20
    drill = tmp_path / "d.yaml"
    drill.write_text(f"""\
name: closed
rounds: 1
baseline_s: 0.5
target: {{kind: command, environment: test, base_url: "{url}", model: m}}
load: {{concurrency: 2, prompt_tokens: 8, max_tokens: 2}}
ramp: {{knob: concurrency, start: 2, factor: 2, ceiling: 8, step_s: 2}}
stop: {{wall_clock_s: 3}}
""")
    t = time.monotonic()
    res = _vramlab("drill", str(drill), "--db", str(tmp_path / "d.db"), timeout=90)
    took = time.monotonic() - t
    assert res.returncode not in (0, 70) and "Traceback" not in res.stderr, res.stderr
    assert "wall clock" in res.stderr and "connection refused" in res.stderr, res.stderr
    assert took < 3 + 15, took  # it waited 60 s for a health check before
