"""Instant queries against a Prometheus server's HTTP API (``/api/v1/query``), one sample per
series returned: ``prometheus.<query name>`` with the series' labels.

Bounded like every poller (vramlab.observe.http): an answer is read up to `MAX_ANSWER_BYTES`, parsed
off the event loop when large, and at most `MAX_SERIES` series of a query are kept (a query that
matches more is too broad to chart; the sampler says so once)."""

from __future__ import annotations

import json
import time
from typing import Any

from vramlab.observe import http
from vramlab.observe.base import Sample, Sampler, SourceUnavailable

MAX_ANSWER_BYTES = 1 * http.MIB  # a JSON parse holds the GIL: a bigger answer would stall the load
MAX_SERIES = 1000


def parse_query_result(name: str, doc: Any, t: float, max_series: int = MAX_SERIES) -> list[Sample]:
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, dict) else None
        raise ValueError(f"query {name!r} failed: {err or 'not a Prometheus API answer'}")
    data = doc.get("data") or {}
    rtype, result = data.get("resultType"), data.get("result")
    out = []
    if rtype == "vector":
        for series in (result or [])[:max_series]:
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
        self._notes: list[str] = []
        self._broad: set[str] = set()

    async def open(self) -> None:
        if not self.queries:
            raise SourceUnavailable("no samplers.prometheus_queries given")
        self._session = http.session(self.timeout_s)
        try:
            answer = await http.get(self._session, self.url + "/api/v1/status/buildinfo", 64 * http.KIB)
            if answer.status != 200:
                raise SourceUnavailable(f"{self.url}: HTTP {answer.status}")
        except SourceUnavailable:
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise SourceUnavailable(f"{self.url}: {type(exc).__name__}: {exc}"[:200]) from None

    async def sample(self) -> list[Sample]:
        out = []
        for name, q in self.queries.items():
            answer = await http.get(
                self._session, self.url + "/api/v1/query", MAX_ANSWER_BYTES, params={"query": q}
            )
            doc = await http.parse_off_loop(json.loads, answer.body)
            found = parse_query_result(name, doc, time.perf_counter(), MAX_SERIES + 1)
            if len(found) > MAX_SERIES and name not in self._broad:
                self._broad.add(name)
                self._notes.append(
                    f"sampler prometheus: query {name!r} matches more than {MAX_SERIES:,} series; "
                    f"the first {MAX_SERIES:,} are kept"
                )
            out += found[:MAX_SERIES]
        return out

    def take_notes(self) -> list[str]:
        out, self._notes = self._notes, []
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
