"""A tiny OpenAI-compatible streaming endpoint on loopback, for tests and the load-generator
benchmark: it answers instantly or slowly, stalls, fails, or streams garbage on demand.
Not a simulation (that is ``vramlab sim``): it has no memory model, only controllable behaviour.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StubBehaviour:
    """Mutable on purpose: a test changes it while the server runs."""

    ttft_s: float = 0.0
    token_s: float = 0.0
    fail_status: int | None = None  # answer every request with this status
    fail_body: str = '{"error": {"message": "boom"}}'
    stall_until: float = 0.0  # time.monotonic() until which new requests wait before answering
    stall_first_s: float = 0.0  # the first request starts a stall this long (independent of set-up time)
    midstream_error: str | None = None  # sent as an error event after the first token
    garbage: bool = False
    usage: bool = True
    reasoning_tokens: int = (
        0  # the first N tokens are reasoning (a reasoning model), sent under reasoning_key
    )
    reasoning_key: str = "reasoning_content"
    empty_completion: bool = False  # finish_reason "stop" at once, no text
    send_done: bool = True  # end with data: [DONE]
    api_key: str | None = None
    metrics_text: str = ""
    health_status: int = 200
    reject_fields: tuple[str, ...] = ()  # answer 422 naming them, as a strict OpenAI-compatible server does
    seen: list[dict[str, Any]] = field(default_factory=list)


class StubServer:
    def __init__(self, behaviour: StubBehaviour | None = None) -> None:
        self.b = behaviour or StubBehaviour()
        self.url = ""
        self._runner: Any = None

    async def __aenter__(self) -> StubServer:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/version", self._version)
        # Tests stop it with handlers still sleeping: do not wait for them.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

    def _auth_ok(self, request: Any) -> bool:
        return self.b.api_key is None or request.headers.get("Authorization") == f"Bearer {self.b.api_key}"

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        if not self._auth_ok(request):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        return web.json_response({"data": [{"id": "stub-model"}]})

    async def _version(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"version": "stub-1"})

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(status=self.b.health_status, text="ok")

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=self.b.metrics_text, content_type="text/plain")

    async def _complete(self, request: Any) -> Any:
        from aiohttp import web

        b = self.b
        body = await request.json()
        b.seen.append(body)
        if b.stall_first_s and len(b.seen) == 1:
            b.stall_until = time.monotonic() + b.stall_first_s
        wait = b.stall_until - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if not self._auth_ok(request):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        if b.fail_status is not None:
            return web.Response(status=b.fail_status, text=b.fail_body, content_type="application/json")
        extra = {f for f in b.reject_fields if f in body}
        if extra:
            return web.json_response(
                {"error": {"message": f"Unexpected fields in the request: {extra}"}}, status=422
            )
        try:
            return await self._stream(request, body)
        except ConnectionError:  # the client went away (a cancelled window); nothing to answer
            return web.Response(status=499)

    async def _stream(self, request: Any, body: dict[str, Any]) -> Any:
        from aiohttp import web

        b = self.b
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_tokens", 16))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if b.ttft_s:
            await asyncio.sleep(b.ttft_s)
        if b.garbage:
            await resp.write(b"data: this is not json\n\n")
            await resp.write_eof()
            return resp
        if b.empty_completion:
            n = 0
            fin = (
                {"index": 0, "delta": {}, "finish_reason": "stop"}
                if chat
                else {"index": 0, "text": "", "finish_reason": "stop"}
            )
            await resp.write(b"data: " + json.dumps({"choices": [fin]}).encode() + b"\n\n")
        for i in range(n):
            if i and b.token_s:
                await asyncio.sleep(b.token_s)
            if chat and i < b.reasoning_tokens:
                choice: dict[str, Any] = {"index": 0, "delta": {b.reasoning_key: f" r{i}", "content": None}}
            elif chat:
                choice = {"index": 0, "delta": {"content": f" t{i}"}}
            else:
                choice = {"index": 0, "text": f" t{i}"}
            await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
            if i == 0 and b.midstream_error:
                await resp.write(
                    b"data: " + json.dumps({"error": {"message": b.midstream_error}}).encode() + b"\n\n"
                )
                await resp.write_eof()
                return resp
        if b.usage:
            usage: dict[str, Any] = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
            if b.reasoning_tokens:
                usage["completion_tokens_details"] = {"reasoning_tokens": min(n, b.reasoning_tokens)}
            await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        if b.send_done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
