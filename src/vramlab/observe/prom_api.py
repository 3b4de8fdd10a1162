"""Instant queries against a Prometheus server's HTTP API (``/api/v1/query``), one sample per
series returned: ``prometheus.<query name>`` with the series' labels."""

from __future__ import annotations

import time
from typing import Any

from vramlab.observe.base import Sample, Sampler, SourceUnavailable


def parse_query_result(name: str, doc: Any, t: float) -> list[Sample]:
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, dict) else None
        raise ValueError(f"query {name!r} failed: {err or 'not a Prometheus API answer'}")
    data = doc.get("data") or {}
    rtype, result = data.get("resultType"), data.get("result")
    out = []
    if rtype == "vector":
        for series in result or ():
            labels = {str(k): str(v) for k, v in (series.get("metric") or {}).items()}
            out.append(Sample("prometheus", f"prometheus.{name}", float(series["value"][1]), t, labels))
    elif rtype == "scalar" and result is not None:
        out.append(Sample("prometheus", f"prometheus.{name}", float(result[1]), t))
    return out


class PromApiSampler(Sampler):
    source = "prometheus"

    def __init__(self, url: str, queries: dict[str, str], timeout_s: float = 2.0) -> None:
        self.url, self.queries, self.timeout_s = url.rstrip("/"), dict(queries), timeout_s
        self._session: Any = None

    async def open(self) -> None:
        import aiohttp

        if not self.queries:
            raise SourceUnavailable("no samplers.prometheus_queries given")
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            async with self._session.get(self.url + "/api/v1/status/buildinfo") as resp:
                if resp.status != 200:
                    raise SourceUnavailable(f"{self.url}: HTTP {resp.status}")
        except SourceUnavailable:
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise SourceUnavailable(f"{self.url}: {type(exc).__name__}: {exc}"[:200]) from None

    async def sample(self) -> list[Sample]:
        out = []
        for name, q in self.queries.items():
            async with self._session.get(self.url + "/api/v1/query", params={"query": q}) as resp:
                doc = await resp.json(content_type=None)
            out += parse_query_result(name, doc, time.perf_counter())
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
