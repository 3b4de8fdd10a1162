"""A health probe: GET the target's health URL; up (1/0), status code and latency as samples.

A failed probe is data (``health.up`` 0), not a sampler failure.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from vramlab.observe.base import Sample, Sampler


class HealthSampler(Sampler):
    source = "health"

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._session: Any = None

    def _request(self) -> Any:
        """The probe's request; a GET of the health URL (subclasses may POST instead)."""
        return self._session.get(self.url)

    async def open(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def sample(self) -> list[Sample]:
        import aiohttp

        t0 = time.perf_counter()
        status = 0
        try:
            async with self._request() as resp:
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
