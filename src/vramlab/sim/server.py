"""The sim's HTTP server (aiohttp): OpenAI-compatible API, /health, /version, /metrics, faults.

`SimServer` runs inside the caller's event loop (tests, `vramlab demo`); `vramlab sim serve`
runs one in its own process and exits with the engine's exit code when the engine dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from vramlab.sim.api import (
    ApiError,
    Parsed,
    chunk,
    error_body,
    full_response,
    parse_request,
    prompt_tokens_of,
    tokenize_answer,
    usage_chunk,
)
from vramlab.sim.config import SimConfig, compute_estimate
from vramlab.sim.engine import SimEngine, StartupRefused
from vramlab.sim.faults import arm
from vramlab.sim.ledger import DeviceLedger
from vramlab.sim.metrics import EngineCollector, Gauges, render
from vramlab.sim.startup_log import EngineLog
from vramlab.sim.tokenizer import token_text

__all__ = ["SimServer", "StartupRefused"]


class SimServer:
    def __init__(self, cfg: SimConfig, log_stream: IO[str] | None = None):
        self.cfg = cfg
        self._log_stream = log_stream
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._runner: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._ids = itertools.count(1)
        self._in_flight = 0
        self.port = cfg.port
        self.engine: SimEngine
        self.log: EngineLog

    # --- lifecycle ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    @property
    def exit_code(self) -> int | None:
        return self.engine.exit_code

    async def start(self) -> None:
        """Start the engine (raises StartupRefused), then listen."""
        from aiohttp import web

        cfg = self.cfg
        device = cfg.device
        if device is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="vramlab-sim-")
            device = str(Path(self._tmp.name) / "gpu0.ledger")
        self.log = EngineLog(cfg.engine, self._log_stream, cfg.log_file)
        est = compute_estimate(cfg)
        ledger = DeviceLedger(device, gpu=cfg.gpu)
        self.engine = SimEngine(cfg, est, ledger, self.log)
        app = web.Application(client_max_size=64 << 20)
        app.add_routes(
            [
                web.get("/health", self._health),
                web.get("/version", self._version),
                web.get("/v1/models", self._models),
                web.get("/metrics", self._metrics),
                web.post("/v1/completions", self._completions),
                web.post("/v1/chat/completions", self._chat),
                web.post("/tokenize", self._tokenize),
                web.post("/sim/fault", self._fault),
                web.get("/sim/state", self._state),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        listen_first = cfg.engine == "llama.cpp"  # llama-server answers 503 "Loading model" while loading
        if listen_first:
            await self._listen()
        try:
            await self.engine.startup()
        except BaseException:
            await self._runner.cleanup()
            self.log.close()
            raise
        if not listen_first:
            await self._listen()
        self._tasks = [asyncio.create_task(self.engine.run()), asyncio.create_task(self._log_stats())]
        if cfg.faults:
            self._tasks.append(asyncio.create_task(arm(self.engine.faults, cfg.faults, self.engine._wake)))

    async def _listen(self) -> None:
        from aiohttp import web

        from vramlab.errors import ConfigError

        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:  # the port is taken, the host is not this machine's: the user's to fix
            raise ConfigError(
                f"cannot listen on {self.cfg.host}:{self.cfg.port}: {exc.strerror or exc}"
                + (" (another server holds the port; --port 0 picks a free one)" if exc.errno == 98 else "")
            ) from None
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        if self.cfg.engine == "vllm":
            self.log.info(f"Starting vLLM API server 0 on {self.url}", "api")
        elif self.cfg.engine == "llama.cpp":
            self.log.info(f"main: server is listening on {self.url} - starting the main loop")
        if self.cfg.engine in ("vllm", "sglang"):
            self.log.raw(f"INFO:     Uvicorn running on {self.url} (Press CTRL+C to quit)")
        elif self.cfg.engine == "tgi":
            self.log.info("Connected")
            self.log.info(f"Listening on {self.url}")

    async def wait_exit(self) -> int:
        """Wait until the engine dies and its watchdog ends the server; the exit code."""
        await self.engine.exited.wait()
        return self.engine.exit_code or 0

    async def stop(self) -> None:
        # Handlers waiting on tokens (a hang, a queue) would hold the runner's shutdown open.
        sched = self.engine.sched if hasattr(self, "engine") else None
        if sched is not None:
            for req in [*sched.running, *sched.waiting]:
                if req.sink is not None:
                    req.sink.put_nowait(("error", "the server is shutting down"))
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._runner is not None:
            await self._runner.cleanup()
        if hasattr(self, "engine"):
            self.engine.release_all()
            self.log.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _log_stats(self) -> None:
        eng, last_p, last_g = self.engine, 0, 0
        interval = self.cfg.log_stats_interval_s
        while not eng.dead:
            await asyncio.sleep(interval)
            s, sched = eng.stats, eng.sched
            assert sched is not None
            p, g = s.prompt_tokens - last_p, s.generation_tokens - last_g
            last_p, last_g = s.prompt_tokens, s.generation_tokens
            if self.cfg.engine == "vllm":
                self.log.info(
                    f"Engine 000: Avg prompt throughput: {p / interval:.1f} tokens/s, Avg generation "
                    f"throughput: {g / interval:.1f} tokens/s, Running: {len(sched.running)} reqs, Waiting: "
                    f"{len(sched.waiting)} reqs, GPU KV cache usage: {sched.kv_cache_usage * 100:.1f}%, "
                    f"Prefix cache hit rate: {(sched.cache.hit_rate if sched.cache else 0.0) * 100:.1f}%",
                    "stats",
                )
            elif self.cfg.engine == "sglang":
                self.log.info(
                    f"Decode batch, #running-req: {len(sched.running)}, #token: {sched.used_tokens}, "
                    f"token usage: {sched.kv_cache_usage:.2f}, gen throughput (token/s): "
                    f"{g / interval:.2f}, #queue-req: {len(sched.waiting)}"
                )

    # --- plain endpoints ----------------------------------------------------------------
    def _json(self, data: Any, status: int = 200) -> Any:
        from aiohttp import web

        return web.json_response(data, status=status)

    def _error(self, err: ApiError) -> Any:
        return self._json(error_body(err, self.cfg.engine, self.engine.version), err.status)

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        eng = self.engine
        if self.cfg.engine == "llama.cpp":
            if not eng.ready:
                return self._json(
                    {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, 503
                )
            return self._json({"status": "ok"}, 503 if eng.dead else 200)
        if eng.dead:
            if self.cfg.engine == "tgi":
                return self._json({"error": "unhealthy", "error_type": "healthcheck"}, 503)
            return web.Response(status=503)
        return web.Response(status=200)

    async def _version(self, request: Any) -> Any:
        return self._json({"version": self.cfg.version_text})

    async def _models(self, request: Any) -> Any:
        owner = {"vllm": "vllm", "sglang": "sglang", "tgi": "tgi", "llama.cpp": "llamacpp"}[self.cfg.engine]
        return self._json(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.cfg.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": owner,
                        "root": self.cfg.model,
                        "parent": None,
                        "max_model_len": self.engine.max_model_len,
                    }
                ],
            }
        )

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST

        eng = self.engine
        sched = eng.sched
        assert sched is not None
        settings = {
            "block_size": str(eng.est.block_size),
            "gpu_memory_utilization": str(eng.util),
            "num_gpu_blocks": str(sched.num_blocks),
            "cache_dtype": self.cfg.kv_cache_dtype,
            "engine": "0",
        }
        gauges = Gauges(
            lambda: len(sched.running),
            lambda: len(sched.waiting),
            lambda: sched.kv_cache_usage,
            lambda: sched.used_tokens,
            sched.num_blocks * sched.block_size,
            settings,
            sched.cache,
        )
        body = render(EngineCollector(self.cfg.engine, eng.version, self.cfg.model_name, eng.stats, gauges))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _state(self, request: Any) -> Any:
        eng, sched = self.engine, self.engine.sched
        assert sched is not None
        return self._json(
            {
                "ready": eng.ready,
                "dead": eng.dead,
                "running": len(sched.running),
                "waiting": len(sched.waiting),
                "num_blocks": sched.num_blocks,
                "free_blocks": sched.free_blocks,
                "preemptions": eng.stats.preemptions,
                "faults": eng.faults.history,
                "max_model_len": eng.max_model_len,
            }
        )

    async def _fault(self, request: Any) -> Any:
        from aiohttp import web

        peer = (
            (request.transport.get_extra_info("peername") or ("0.0.0.0",))[0]
            if request.transport
            else "0.0.0.0"
        )
        if not self.cfg.allow_fault_injection or not ipaddress.ip_address(peer).is_loopback:
            raise web.HTTPNotFound()
        try:
            body = await request.json()
            kind = str(body["kind"])
            self.engine.faults.apply(kind, float(body.get("factor", 10.0)))
        except Exception as exc:  # a bad fault request is the caller's problem, not the engine's
            return self._json({"error": f"bad fault request: {exc}"}, 400)
        self.engine._wake.set()
        self.log.warning(f"sim: fault injected: {kind}")
        return self._json({"ok": True, "faults": self.engine.faults.history})

    async def _tokenize(self, request: Any) -> Any:
        try:
            try:
                body = json.loads(await request.read())
            except (ValueError, RecursionError):
                raise ApiError(400, "JSON decode error") from None
            return self._json(tokenize_answer(body, self.cfg.model_name, self.engine.max_model_len))
        except ApiError as err:
            return self._error(err)

    # --- generation ---------------------------------------------------------------------
    async def _completions(self, request: Any) -> Any:
        return await self._generate(request, chat=False)

    async def _chat(self, request: Any) -> Any:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Any, chat: bool) -> Any:
        eng = self.engine
        try:
            try:
                body = json.loads(await request.read())
            except (ValueError, RecursionError) as exc:  # bad JSON, or nested past the parser's depth
                detail = "nesting too deep" if isinstance(exc, RecursionError) else str(exc)
                raise ApiError(400, f"JSON decode error: {detail}") from None
            parsed = parse_request(body, chat, self.cfg.model_name, eng.max_model_len)
            if eng.dead:
                self.log.info(
                    f'{request.remote}:0 - "POST {request.path} HTTP/1.1" 500 Internal Server Error'
                )
                raise ApiError(
                    500,
                    "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                    "InternalServerError",
                )
            if self.cfg.engine == "tgi" and self._in_flight >= self.cfg.max_concurrent_requests:
                eng.stats.failures["overloaded"] += 1
                raise ApiError(429, "Model is overloaded", "overloaded")
        except ApiError as err:
            if err.status == 400 and self.cfg.engine == "tgi":
                eng.stats.failures["validation"] += 1
            return self._error(err)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.cfg.seed:x}{next(self._ids):015x}"
        # One queue for all n choices: each engine sequence tags what it sends with its choice index.
        sink: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
        self._in_flight += 1
        assert eng.sched is not None
        tokens = prompt_tokens_of(body, chat) if eng.sched.cache is not None else None
        reqs = [
            eng.submit(
                rid if parsed.n == 1 else f"{rid}-{i}",
                parsed.prompt_tokens,
                parsed.max_tokens,
                parsed.ignore_eos,
                _choice_key(parsed.key, i),
                _Tagged(sink, i),  # type: ignore[arg-type]
                tokens,
            )
            for i in range(parsed.n)
        ]
        # usage.prompt_tokens_details.cached_tokens: what the prefix cache served (vLLM with
        # --enable-prompt-tokens-details; llama-server always says it)
        details = self.cfg.prompt_tokens_details or self.cfg.engine == "llama.cpp"
        cached = (lambda: reqs[0].cached_tokens) if details else None
        try:
            if parsed.stream:
                return await self._stream(request, rid, parsed, sink, cached)
            return await self._collect(rid, parsed, sink, cached)
        finally:
            self._in_flight -= 1
            for req in reqs:
                eng.abort(req)  # a no-op when finished; frees the blocks of a client that went away

    async def _collect(
        self,
        rid: str,
        p: Parsed,
        sink: asyncio.Queue[tuple[int, str, Any]],
        cached: Callable[[], int] | None = None,
    ) -> Any:
        parts: list[list[str]] = [[] for _ in range(p.n)]
        finishes: list[str | None] = [None] * p.n
        while any(f is None for f in finishes):
            i, kind, value = await sink.get()
            if kind == "token":
                parts[i].append(token_text(self.cfg.seed, _choice_key(p.key, i), value))
            elif kind == "done":
                finishes[i] = value
            else:
                return self._error(ApiError(500, value, "InternalServerError"))
        return self._json(
            full_response(
                rid,
                self.cfg.model_name,
                p.chat,
                ["".join(x) for x in parts],
                [str(f) for f in finishes],
                p.prompt_tokens,
                sum(len(x) for x in parts),
                cached() if cached else None,
            )
        )

    async def _stream(
        self,
        request: Any,
        rid: str,
        p: Parsed,
        sink: asyncio.Queue[tuple[int, str, Any]],
        cached: Callable[[], int] | None = None,
    ) -> Any:
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        model, n, open_ = self.cfg.model_name, 0, p.n
        try:
            await resp.prepare(request)

            async def send(obj: Any) -> None:
                await resp.write(
                    b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
                )

            if p.chat:
                for i in range(p.n):
                    await send(chunk(rid, model, True, "", None, first=True, index=i))
            while open_:
                i, kind, value = await sink.get()
                if kind == "token":
                    n += 1
                    await send(
                        chunk(
                            rid,
                            model,
                            p.chat,
                            token_text(self.cfg.seed, _choice_key(p.key, i), value),
                            None,
                            index=i,
                        )
                    )
                elif kind == "done":
                    open_ -= 1
                    await send(chunk(rid, model, p.chat, None if p.chat else "", value, index=i))
                else:  # the status is already 200: the error travels as the next chunk (vLLM launcher.py)
                    await send(
                        error_body(
                            ApiError(500, value, "InternalServerError"), self.cfg.engine, self.engine.version
                        )
                    )
                    break
            else:
                if p.include_usage:
                    await send(
                        usage_chunk(rid, model, p.chat, p.prompt_tokens, n, cached() if cached else None)
                    )
            await send(b"[DONE]")
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError) as exc:
            # The client went away mid-stream: one line, not a traceback; the caller frees its blocks.
            self.log.info(f"client disconnected: {rid} after {n} tokens ({type(exc).__name__})")
            if isinstance(exc, asyncio.CancelledError):
                raise
        return resp


class _Tagged:
    """The engine's sink for one choice of a request: puts (choice index, kind, value) on the shared queue."""

    def __init__(self, queue: asyncio.Queue[tuple[int, str, Any]], index: int) -> None:
        self.queue, self.index = queue, index

    def put_nowait(self, item: tuple[str, Any]) -> None:
        self.queue.put_nowait((self.index, *item))


def _choice_key(key: str, index: int) -> str:
    """Choice 0 keeps the request's own text (n = 1 answers stay as they were); others differ."""
    return key if index == 0 else f"{key}#{index}"
