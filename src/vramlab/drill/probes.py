"""A neighbour probe that asks for one token (`kind: generate`), not just /health.

A health check on an engine whose activation headroom another process took still answers 200;
the first real request is what fails (CUDA OOM, engine death). It is the health sampler with a
one-token completion instead of a GET, so the samples keep its names (`health.up`,
`health.latency_ms`) and the blast-radius figures read either.
"""

from __future__ import annotations

from typing import Any

from vramlab.observe.health import HealthSampler


class GenerateProbe(HealthSampler):
    def __init__(self, url: str, model: str, timeout_s: float = 2.0) -> None:
        super().__init__(url, timeout_s)
        self.model = model

    def _request(self) -> Any:
        return self._session.post(self.url, json={"model": self.model, "prompt": "ping", "max_tokens": 1})


__all__ = ["GenerateProbe"]
