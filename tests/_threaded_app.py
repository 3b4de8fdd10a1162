"""An aiohttp app served on loopback from its own thread and event loop, for tests that run vramlab (a
subprocess, or a runner in the test's own loop) against a small fake server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve_app(make_app: Callable[[], Any]) -> Iterator[int]:
    """Serve the `web.Application` that *make_app* builds (called on the server's loop); yields its port."""
    from aiohttp import web

    ready, box = threading.Event(), dict[str, Any]()

    def serve() -> None:
        async def main() -> None:
            runner = web.AppRunner(make_app(), access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            box["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
            ready.set()
            await box["stop"].wait()
            await runner.cleanup()

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    try:
        yield int(box["port"])
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        t.join(5)
