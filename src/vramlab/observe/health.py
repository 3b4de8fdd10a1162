"""A health probe: GET the target's health URL; up (1/0), status code and latency as samples.

A failed probe is data (``health.up`` 0), not a sampler failure.

Health discovery: engines disagree on the path (vLLM, SGLang, TGI and llama.cpp's `llama-server`
have `/health`; llama-cpp-python's server and Ollama do not: `/v1/models`, `/`). `discover_health`
tries a preferred path first, then `/health`, `/v1/models`, `/`, and takes the first that answers
200. A path that answers 404 or 405 does not exist there, and the server that said so is up: the
summary says exactly that. A path that answers 503 exists and is not ready yet (loading): it is
waited on. A `HealthSampler` given `discover_root` runs a short discovery when it opens (the plan
named no health URL) and says what answered in `open_note`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vramlab.observe import http
from vramlab.observe.base import Sample, Sampler

# A health answer is read for its status; its body, up to this, only to keep the connection.
HEALTH_BODY_BYTES = 64 * http.KIB


class HealthSampler(Sampler):
    source = "health"

    def __init__(self, url: str, timeout_s: float = 2.0, discover_root: str | None = None) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.discover_root = discover_root  # no health URL in the plan: find the path at open()
        self.open_note: str | None = None
        self._session: Any = None

    def _request(self) -> Any:
        """The probe's request; a GET of the health URL (subclasses may POST instead)."""
        return self._session.get(self.url)

    async def open(self) -> None:

        if self.discover_root is not None:
            found = await discover_health(self.discover_root, "/health", 1.5, settle=True)
            if found.path is not None:
                self.url = self.discover_root.rstrip("/") + found.path
                if found.path != "/health":
                    self.open_note = f"sampler health: {found.summary()}"
        self._session = http.session(self.timeout_s)

    async def sample(self) -> list[Sample]:
        import aiohttp

        t0 = time.perf_counter()
        status = 0
        try:
            async with self._request() as resp:
                status = resp.status
                await resp.content.read(HEALTH_BODY_BYTES)  # what is left is dropped with the connection
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            status = 0  # no answer, or one no HTTP client could read (over 128 headers): down
        now = time.perf_counter()
        up = 1.0 if 200 <= status < 300 else 0.0
        return [
            Sample("health", "health.up", up, now),
            Sample("health", "health.status_code", status, now),
            Sample("health", "health.latency_ms", (now - t0) * 1000, now),
        ]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


CANDIDATES = ("/health", "/v1/models", "/")


@dataclass
class HealthDiscovery:
    path: str | None = None  # the path that answered 200
    answers: dict[str, str] = field(default_factory=dict)  # path -> its last answer, in words
    preferred: str = "/health"

    def summary(self) -> str:
        parts = [f"{p} answered {a}" for p, a in self.answers.items()]
        if self.path is not None:
            others = [x for x in parts if not x.startswith(f"{self.path} ")]
            used = f"health check on {self.path} (HTTP 200)"
            if self.path != self.preferred and others:
                return f"{used}; " + "; ".join(others) + " (the server is up, so the next path was tried)"
            return used
        missing = [p for p, a in self.answers.items() if a.startswith("HTTP 404") or a.startswith("HTTP 405")]
        up = any(a.startswith("HTTP") for a in self.answers.values())
        tail = (
            " — the server is up and answering, but has none of these health paths ready"
            if up
            else " — nothing answered HTTP: is it running and is base_url right?"
        )
        if missing and up:
            tail = (
                f" — the server is up and answering HTTP 404 on {', '.join(missing)}; set target.health_path "
                "to a path it serves"
            )
        return "; ".join(parts) + tail if parts else "no answer" + tail


async def discover_health(
    root: str,
    preferred: str | None,
    limit_s: float,
    alive: Callable[[], bool] = lambda: True,
    settle: bool = False,
) -> HealthDiscovery:
    """Poll until one path answers 200 (plan's path first), `limit_s` passes, or `alive()` says the
    process is gone. `settle`: one round of the paths only (the target is up already)."""
    import aiohttp

    from vramlab.observe.http import KIB, get, session

    first = preferred or "/health"
    paths = [first] + [p for p in CANDIDATES if p != first]
    out = HealthDiscovery(preferred=first)
    deadline = time.monotonic() + limit_s
    base = root.rstrip("/")
    async with session(2.0) as s:
        while time.monotonic() < deadline:
            for p in paths:
                try:
                    answer = await get(s, base + p, 4 * KIB, partial=True)
                    if answer.status == 200:
                        out.path = p
                        out.answers[p] = "HTTP 200"
                        return out
                    text = answer.body[:120].decode("utf-8", "replace").strip().replace("\n", " ")
                    out.answers[p] = f"HTTP {answer.status}" + (f" {text!r}" if text else "")
                    if answer.status not in (404, 405, 501):
                        break  # the path exists and is not ready (503 while loading): wait on it
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                    out.answers[p] = _no_answer(exc)
                    break  # no server yet: the other paths would say the same
            if settle or not alive():
                break
            await asyncio.sleep(0.2)
    return out


def _no_answer(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer within 2 s"
    cause = getattr(exc, "os_error", None) or exc
    text = str(exc) or type(exc).__name__
    if (
        isinstance(cause, ConnectionRefusedError)
        or "refused" in text.lower()
        or "connect call failed" in text.lower()
    ):
        return "connection refused"
    return f"no answer ({text[:80]})"
