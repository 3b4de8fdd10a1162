"""Each tenant's slice of a conversations run, window by window, against its own SLO. Pure.

A run whose input is `conversations` with tenants stores every request with its tenant; here each
window's requests are split by tenant and summarized as a window is (goodput by the tenant's own
latency limits), and every limit of the tenant's SLO is checked as the plan's thresholds are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vramlab.analysis.stats import RequestSummary, summarize_requests
from vramlab.analysis.thresholds import observed, slo_from_metrics
from vramlab.analysis.windows import WindowResult
from vramlab.records import RequestRecord


@dataclass(frozen=True)
class TenantWindow:
    round: int
    phase: str
    step: int | None
    step_value: float | None
    tenant: str
    requests: RequestSummary
    slo: dict[str, float]
    observed: dict[str, float | None]
    broken: tuple[str, ...]  # the limits it broke (or could not measure)

    @property
    def meets(self) -> bool | None:
        return None if not self.slo else not self.broken


def tenant_slos(plan: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """tenant name -> its SLO, from a stored plan's fixed.input.conversations.tenants."""
    conv = ((plan.get("fixed") or {}).get("input") or {}).get("conversations") or {}
    return {
        t["name"]: {k: float(v) for k, v in (t.get("slo") or {}).items()} for t in conv.get("tenants") or []
    }


def tenant_windows(
    windows: Sequence[WindowResult],
    requests: Sequence[RequestRecord],
    slos: Mapping[str, Mapping[str, float]],
) -> list[TenantWindow]:
    if not slos:
        return []
    by_key: dict[tuple[int, str, int, str], list[RequestRecord]] = {}
    for r in requests:
        if r.tenant is not None:
            by_key.setdefault((r.round, r.phase, r.step, r.tenant), []).append(r)
    out = []
    for w in windows:
        win = w.window
        for tenant, slo in slos.items():
            mine = by_key.get((win.round, win.phase, win.step or 0, tenant), [])
            if not mine:
                continue
            summary = summarize_requests(mine, win.duration_s, slo_from_metrics(slo))
            seen = {k: observed(summary, k) for k in slo}
            broken = tuple(k for k, limit in slo.items() if seen[k] is None or seen[k] > limit)  # type: ignore[operator]
            out.append(
                TenantWindow(
                    win.round, win.phase, win.step, win.step_value, tenant, summary, dict(slo), seen, broken
                )
            )
    return out


__all__ = ["TenantWindow", "tenant_slos", "tenant_windows"]
