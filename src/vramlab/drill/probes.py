"""A neighbour probe that asks for one token (`kind: generate`), not just /health.

A health check on an engine whose activation headroom another process took still answers 200;
the first real request is what fails (CUDA OOM, engine death). Same sample names as the health
sampler (`health.up`, `health.latency_ms`), so the blast-radius figures read either.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from vramlab.observe.base import Sample


class GenerateProbe:
    source = "health"

    def __init__(self, url: str, model: str, timeout_s: float = 2.0) -> None:
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self._session: Any = None

    async def open(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def sample(self) -> list[Sample]:
        import aiohttp

        t0 = time.perf_counter()
        status = 0
        body = {"model": self.model, "prompt": "ping", "max_tokens": 1}
        try:
            async with self._session.post(self.url, json=body) as resp:
                status = resp.status
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            status = 0
        now = time.perf_counter()
        up = 1.0 if 200 <= status < 300 else 0.0
        return [Sample("health", "health.up", up, now), Sample("health", "health.status_code", status, now),
                Sample("health", "health.latency_ms", (now - t0) * 1000, now)]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


__all__ = ["GenerateProbe"]
