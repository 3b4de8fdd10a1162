"""The plan's two ways of changing the variable beyond a list of steps: `change.search` (the largest
value that still meets every SLO, analysis/slo_search.py) and `change.soak` (one long treatment,
its windows compared with the first, analysis/soak.py). Documents: docs/experiments.md."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The names plan.metrics takes: a statistic of a per-request latency, or the error rate.
SLO_NAME = re.compile(r"^(p50|p90|p95|p99|max|mean)_(ttft|tpot|itl|e2e)_ms$|^error_rate$")
MAX_PROBES = 32


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Search(_Model):
    """`change.search`: bracket from `low` (doubling up to `high`), then bisect, each probe one
    treatment window; a probe meets the SLO when every limit holds, it held at least `min_requests`
    requests, and its throughput still rose (saturation ends the bracket)."""

    variable: str | None = Field(
        default=None, description="concurrency or request_rate (default change.variable)"
    )
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    slo: dict[str, float] = Field(
        min_length=1, description="limits, as plan metrics name them: p95_ttft_ms, error_rate, ..."
    )
    resolution: float | None = Field(
        default=None,
        gt=0,
        description="stop when the bracket is this narrow (default 1 for concurrency, 5% for a rate)",
    )
    min_requests: int = Field(
        default=30, ge=1, le=1_000_000, description="a probe with fewer decides nothing"
    )
    max_probes: int = Field(default=16, ge=2, le=MAX_PROBES)

    @field_validator("slo")
    @classmethod
    def _names(cls, v: dict[str, float]) -> dict[str, float]:
        for k, limit in v.items():
            if not SLO_NAME.match(k):
                raise ValueError(
                    f"unknown SLO {k!r}; use e.g. p95_ttft_ms, p95_itl_ms, p99_e2e_ms, error_rate"
                )
            if limit < 0:
                raise ValueError(f"{k}: a limit must be >= 0")
        return v

    @model_validator(mode="after")
    def _bracket(self) -> Search:
        if self.high < self.low:
            raise ValueError("high must be at least low")
        return self


class Soak(_Model):
    """`change.soak`: the variable held at `value` for one treatment window of `duration_s`, cut
    into windows of `window_s` compared with the first (analysis/soak.py), with limits for the verdict."""

    value: float = Field(gt=0, description="the variable's value held through the soak")
    duration_s: float = Field(gt=0, le=30 * 86400)
    window_s: float = Field(default=300.0, gt=0)
    max_memory_growth_gib_per_h: float = Field(default=0.5, ge=0)
    max_latency_drift: float = Field(
        default=0.25, ge=0, description="P95 up by this share of the first window's"
    )
    max_error_drift: float = Field(default=0.01, ge=0, description="error rate up by this (0.01: one point)")

    @model_validator(mode="after")
    def _windows(self) -> Soak:
        if self.window_s * 2 > self.duration_s:
            raise ValueError(
                "window_s: a soak needs at least two windows to compare (window_s <= duration_s / 2)"
            )
        if self.duration_s / self.window_s > 10_000:
            raise ValueError("window_s: more than 10,000 windows; use longer windows")
        return self


__all__ = ["MAX_PROBES", "SLO_NAME", "Search", "Soak"]
