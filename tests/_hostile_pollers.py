"""A target whose monitoring endpoints answer badly on purpose, while its chat endpoint serves well.

One mode per server: /metrics, /health, /api/ps or /api/version (or the Prometheus API) answers
with a gzip bomb, a body of hundreds of MB, a million series, NaN and Inf, ten thousand Ollama
models or more headers than an HTTP client reads. `/v1/chat/completions` streams four tokens at
once either way, so a run's request count shows whether the pollers starved the load.

Run it alone to try a mode by hand: `python tests/_hostile_pollers.py MODE PORT`.
"""

from __future__ import annotations

import functools
import json
import struct
import sys
import zlib
from typing import Any

BOMB_BYTES = 256 << 20  # what a bomb inflates to
HUGE_BYTES = 300 << 20  # a plain body this long
SERIES = 1_000_000
MODELS = 10_000

MODES = (
    "normal",
    "metrics-bomb",
    "metrics-huge",
    "metrics-series",
    "metrics-nan",
    "ps-bomb",
    "ps-huge",
    "ps-many",
    "version-bomb",
    "health-bomb",
    "health-huge",
    "health-headers",
    "prometheus-bomb",
    "prometheus-series",
)


@functools.cache
def gzip_bomb() -> bytes:
    """BOMB_BYTES of newlines (valid, empty Prometheus text; whitespace around JSON), gzip'd: ~260 KiB.

    Built without compressing it all: once the window is full of newlines, each further MiB deflates
    to the same bytes, so the stream is the first MiB's, that block repeated, and the end."""
    piece, n = b"\n" * (1 << 20), BOMB_BYTES >> 20
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = c.compress(piece) + c.flush(zlib.Z_SYNC_FLUSH)
    again = c.compress(piece) + c.flush(zlib.Z_SYNC_FLUSH)
    crc = 0
    for _ in range(n):
        crc = zlib.crc32(piece, crc)
    head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return head + first + again * (n - 1) + c.flush() + struct.pack("<II", crc, BOMB_BYTES & 0xFFFFFFFF)


@functools.cache
def many_series() -> bytes:
    head = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
    return head + b"".join(b'junk_metric{id="%d"} 1\n' % i for i in range(SERIES))


NAN_METRICS = (
    b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc NaN\n"
    b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running +Inf\n"
    b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting -Inf\n"
    b'# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{a="1"} 3\n'
)


@functools.cache
def prometheus_series() -> bytes:
    result = [{"metric": {"i": str(i)}, "value": [0, "1"]} for i in range(200_000)]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def ps_many() -> bytes:
    models = [
        {
            "name": f"m{i}:latest",
            "model": f"m{i}:latest",
            "size": 1 << 30,
            "size_vram": 1 << 30,
            "digest": "d" * 64,
        }
        for i in range(MODELS)
    ]
    return json.dumps({"models": models}).encode()


def make_app(mode: str) -> Any:
    from aiohttp import web

    if mode.endswith("-bomb"):
        gzip_bomb()  # made before the server answers (seconds of CPU), not in its first poll

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for t in ("a", "b", "c", "d"):
            chunk = {"choices": [{"index": 0, "delta": {"content": t}}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def huge(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(HUGE_BYTES)})
        await resp.prepare(request)
        piece = b"#" * (1 << 20)
        for _ in range(HUGE_BYTES >> 20):
            await resp.write(piece)
        return resp

    async def bomb(_: web.Request) -> web.Response:
        return web.Response(body=gzip_bomb(), headers={"Content-Encoding": "gzip"})

    def ok(body: bytes) -> Any:
        async def answer(_: web.Request) -> web.Response:
            return web.Response(body=body)

        return answer

    async def many_headers(_: web.Request) -> web.Response:
        return web.Response(text="ok", headers={f"X-H{i}": "x" for i in range(150)})

    metrics = ok(b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
    ps = ok(b'{"models": []}')
    version = ok(b'{"version": "0.12.3"}')
    health: Any = ok(b"ok")
    query = ok(b'{"status": "success", "data": {"resultType": "vector", "result": []}}')
    if mode == "metrics-bomb":
        metrics = bomb
    elif mode == "metrics-huge":
        metrics = huge
    elif mode == "metrics-series":
        metrics = ok(many_series())
    elif mode == "metrics-nan":
        metrics = ok(NAN_METRICS)
    elif mode == "ps-bomb":
        ps = bomb
    elif mode == "ps-huge":
        ps = huge
    elif mode == "ps-many":
        ps = ok(ps_many())
    elif mode == "version-bomb":
        version = bomb
    elif mode == "health-bomb":
        health = bomb
    elif mode == "health-huge":
        health = huge
    elif mode == "health-headers":
        health = many_headers
    elif mode == "prometheus-bomb":
        query = bomb
    elif mode == "prometheus-series":
        query = ok(prometheus_series())
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", ok(b'{"data": [{"id": "m"}]}'))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/api/ps", ps)
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/v1/status/buildinfo", ok(b'{"status": "success"}'))
    app.router.add_get("/api/v1/query", query)
    return app


if __name__ == "__main__":
    from aiohttp import web

    web.run_app(make_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]))
