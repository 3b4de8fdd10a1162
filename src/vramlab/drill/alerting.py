"""When did each alert go pending and firing during the drill?

Two sources. With a Prometheus URL in the plan, the drill polls its HTTP API (`/api/v1/alerts`)
and records each rule's state changes as they happen (source "prometheus"). Without one, the
plan's rules are evaluated after the drill on the drill's own samples, with the same threshold
and `for:` duration (source "evaluated"), so the report can still say whether and when the rule
would have fired. Rules whose signal the drill did not sample are reported as not evaluated.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from vramlab.alerts.rules import AlertRuleSpec
from vramlab.records.event_payloads import AlertData

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


def _series(
    rule: AlertRuleSpec, samples: Sequence[Any], requests: Sequence[Any]
) -> list[tuple[float, float]] | None:
    """The drill's own reading of a rule's signal, as (t_s, value)."""

    def named(n: str) -> list[tuple[float, float]]:
        return [(s.t_s, s.value) for s in samples if s.name == n]

    sig = rule.signal
    if sig == "kv_cache_usage":
        return named("engine.kv_cache_usage_perc")
    if sig == "queue_waiting":
        return named("engine.num_requests_waiting")
    if sig == "target_down":
        return [(t, 1.0 - v) for t, v in named("health.up")]
    if sig == "gpu_memory_share":
        return named("gpu.memory_share")
    if sig == "preemption_rate":
        pts = named("engine.num_preemptions_total")
        return [
            (t1, max(0.0, (v1 - v0) / (t1 - t0)))
            for (t0, v0), (t1, v1) in zip(pts, pts[1:], strict=False)
            if t1 > t0
        ]
    if sig == "error_rate":
        ends = sorted(
            (r.end_s, r.ok) for r in requests if r.end_s is not None and r.error_class != "cancelled"
        )
        out, window = [], 1.0  # share failed over the last second, at each request end
        j = 0
        for i, (t, _) in enumerate(ends):
            while ends[j][0] < t - window:
                j += 1
            chunk = ends[j : i + 1]
            out.append((t, sum(1 for _, ok in chunk if not ok) / len(chunk)))
        return out
    return None


def evaluate_rules(
    rules: Sequence[AlertRuleSpec], samples: Sequence[Any], requests: Sequence[Any]
) -> list[AlertData]:
    """Pending and firing times of each rule on the drill's data, as alert event data."""
    out: list[AlertData] = []
    for rule in rules:
        pts = _series(rule, samples, requests) if rule.threshold is not None else None
        if not pts:
            continue
        cmp = _OPS[rule.op]
        pending_at: float | None = None
        fired = False
        for t, v in sorted(pts):
            if cmp(v, float(rule.threshold)):  # type: ignore[arg-type]
                if pending_at is None:
                    pending_at = t
                    out.append(
                        {
                            "name": rule.name,
                            "state": "pending",
                            "t_s": t,
                            "source": "evaluated",
                            "severity": rule.severity,
                            "owner": rule.owner,
                            "for": rule.for_,
                        }
                    )
                if not fired and t - pending_at >= rule.for_s:
                    fired = True
                    out.append(
                        {
                            "name": rule.name,
                            "state": "firing",
                            "t_s": pending_at + rule.for_s,
                            "source": "evaluated",
                            "severity": rule.severity,
                            "owner": rule.owner,
                            "for": rule.for_,
                        }
                    )
            elif pending_at is not None:
                if not fired:
                    out.append(
                        {
                            "name": rule.name,
                            "state": "inactive",
                            "t_s": t,
                            "source": "evaluated",
                            "severity": rule.severity,
                            "owner": rule.owner,
                            "for": rule.for_,
                        }
                    )
                pending_at, fired = None, False
    return out


async def watch_prometheus(
    url: str, on_change: Callable[[str, str, dict[str, str]], None], interval_s: float = 0.5
) -> None:
    """Poll Prometheus's alerts API until cancelled; call on_change(name, state, labels) on each change."""
    import asyncio
    import json

    import aiohttp

    from vramlab.observe import http

    states: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
    async with http.session(2.0) as s:  # bounded like every poller: a huge answer is not read
        while True:
            try:
                answer = await http.get(s, url.rstrip("/") + "/api/v1/alerts", 4 * http.MIB)
                doc = await http.parse_off_loop(json.loads, answer.body)
                seen = set()
                for a in doc.get("data", {}).get("alerts", []):
                    labels = a.get("labels", {})
                    key = (labels.get("alertname", "?"), tuple(sorted(labels.items())))
                    seen.add(key)
                    if states.get(key) != a.get("state"):
                        states[key] = a.get("state", "?")
                        on_change(key[0], states[key], labels)
                for key in [k for k in states if k not in seen and states[k] != "inactive"]:
                    states[key] = "inactive"
                    on_change(key[0], "inactive", dict(key[1]))
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
                pass  # Prometheus away for a moment: the next poll tells
            await asyncio.sleep(interval_s)


__all__ = ["evaluate_rules", "watch_prometheus"]
