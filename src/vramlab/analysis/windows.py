"""Cut a run into windows (round x phase x step) and summarise each: the user, service and
resource layers side by side."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from vramlab.analysis.stats import (
    RequestSummary,
    SampleSummary,
    Slo,
    Window,
    request_span,
    summarize_requests,
    summarize_samples,
)
from vramlab.records import EventRecord, RequestRecord, SampleRecord
from vramlab.records.events import EventKind, phase_end_data

PHASE_ORDER = {"baseline": 0, "ramp": 1, "treatment": 1, "recovery": 2}


@dataclass(frozen=True)
class WindowResult:
    window: Window
    requests: RequestSummary
    resources: SampleSummary

    def metrics(self) -> dict[str, float]:
        """Flat metric name -> value, for deltas and stability (absent metrics left out)."""
        r = self.requests
        out: dict[str, float] = {
            "requests": float(r.count),
            "error_rate": r.error_rate,
            "throughput_rps": r.throughput_rps,
            "output_tok_s": r.output_tok_s,
        }
        if r.goodput_rps is not None:
            out["goodput_rps"] = r.goodput_rps
        for name, dist in (
            ("ttft", r.ttft),
            ("tpot", r.tpot),
            ("e2e", r.e2e),
            ("ttft_sched", r.ttft_sched),
            ("e2e_sched", r.e2e_sched),
        ):
            if dist is not None:
                out[f"{name}_p50_ms"] = dist.p50
                out[f"{name}_p95_ms"] = dist.p95
                out[f"{name}_p99_ms"] = dist.p99
                out[f"{name}_max_ms"] = dist.max
        for name, value in self.resources.worst.items():
            out[name] = value
        return out


def _sort_key(w: Window) -> tuple[int, int, int, str]:
    return (w.round, PHASE_ORDER.get(w.phase, 3), -1 if w.step is None else w.step, w.phase)


def find_windows(
    requests: Sequence[RequestRecord], events: Sequence[EventRecord]
) -> tuple[list[Window], list[Window]]:
    """(step windows, phase windows), in plan order.

    A window spans its requests (first scheduled send to last end). phase_start / phase_end events
    carrying the same round, phase (and step) override that span, since the runner knows the
    planned window even when requests end early.
    """
    groups: dict[tuple[int, str, int], list[RequestRecord]] = {}
    for r in requests:
        groups.setdefault((r.round, r.phase, r.step), []).append(r)
    marks: dict[tuple[int, str, int | None], dict[str, float]] = {}
    lagged: dict[tuple[int, str, int | None], str] = {}
    for e in events:
        if e.kind in (EventKind.PHASE_START, EventKind.PHASE_END) and e.round is not None and e.phase:
            marks.setdefault((e.round, e.phase, e.step), {})[e.kind] = e.t_s
            end = phase_end_data(e) if e.kind == EventKind.PHASE_END else None
            if end is not None and end.get("client_saturated"):
                who = [w.get("name", "?") for w in end.get("client_lag") or () if w.get("saturated")]
                lagged[(e.round, e.phase, e.step)] = ", ".join(who) or "the load client"

    def bounded(
        key: tuple[int, str, int | None], span: tuple[float, float] | None
    ) -> tuple[float, float] | None:
        m = marks.get(key, {})
        start = m.get("phase_start", span[0] if span else None)
        end = m.get("phase_end", span[1] if span else None)
        if start is None or end is None:
            return None
        return start, max(end, start)

    steps: list[Window] = []
    for (rnd, phase, step), reqs in groups.items():
        span = bounded((rnd, phase, step), request_span(reqs))
        if span is None:
            continue
        value = next((r.step_value for r in reqs if r.step_value is not None), None)
        steps.append(
            Window(rnd, phase, step, span[0], span[1], value, client_lag=lagged.get((rnd, phase, step)))
        )

    phase_keys = {(w.round, w.phase) for w in steps} | {(k[0], k[1]) for k in marks}
    phases: list[Window] = []
    for rnd, phase in phase_keys:
        inner = [w for w in steps if (w.round, w.phase) == (rnd, phase)]
        span = (min(w.start_s for w in inner), max(w.end_s for w in inner)) if inner else None
        bounds = bounded((rnd, phase, None), span)
        if bounds is not None:
            lag = sorted({w.client_lag for w in inner if w.client_lag})
            phases.append(Window(rnd, phase, None, bounds[0], bounds[1], client_lag="; ".join(lag) or None))
    return _clip_samples(sorted(steps, key=_sort_key)), _clip_samples(sorted(phases, key=_sort_key))


def _clip_samples(windows: list[Window]) -> list[Window]:
    starts = sorted({w.start_s for w in windows})
    out = []
    for w in windows:
        later = [s for s in starts if s > w.start_s]
        end = min(w.end_s, later[0]) if later else w.end_s
        out.append(dataclasses.replace(w, samples_end_s=end))
    return out


def summarize_window(
    window: Window,
    requests: Sequence[RequestRecord],
    samples: Sequence[SampleRecord],
    slo: Slo | None = None,
) -> WindowResult:
    mine = [
        r
        for r in requests
        if r.round == window.round
        and r.phase == window.phase
        and (window.step is None or r.step == window.step)
    ]
    return WindowResult(
        window=window,
        requests=summarize_requests(mine, window.duration_s, slo),
        resources=summarize_samples(
            samples, window.start_s, window.end_s if window.samples_end_s is None else window.samples_end_s
        ),
    )
