"""Two runs that differ in one thing only (the engine's version, or one variable the user names):
a regression comparison instead of a refusal. Memory composition and latency side by side, the
plan's predicted difference beside the measured one, and a verdict. Pure: analyses in, data out.

What counts as a change (each figure's floor keeps run-to-run noise out of the verdict):
- memory: the peak up, or the KV pool down, by more than MEMORY_REL of the first run's figure and
  MEMORY_FLOOR_BYTES (a smaller pool holds fewer requests);
- latency: a P95 (end to end, from the schedule, or TTFT) of a window the two share up by more than
  LATENCY_REL and LATENCY_FLOOR_MS (the median over rounds, as `compare` prints it), in windows
  that held at least MIN_REQUESTS requests in both runs (the P95 of fewer is mostly its tail's luck);
- errors: the error rate of a shared window up by more than ERROR_FLOOR (a point).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vramlab.analysis.compare import FIXED_KEYS, MetricDelta, compare_runs, flatten, requests_per_cell
from vramlab.analysis.composition import FIGURES, Composition
from vramlab.analysis.run import RunAnalysis

MEMORY_REL, MEMORY_FLOOR_BYTES = 0.01, 64 << 20
LATENCY_REL, LATENCY_FLOOR_MS = 0.20, 5.0
ERROR_FLOOR = 0.01
MIN_REQUESTS = 40
LATENCY_METRICS = ("e2e_p95_ms", "e2e_sched_p95_ms", "ttft_p95_ms")
# What an experiment's plan hash covers (experiment/standard.py), and the rehearsal server it started.
_PLAN_PARTS = ("fixed.", "load.", "phases.", "target.model", "target.api", "target.sim.")


@dataclass(frozen=True)
class Difference:
    key: str  # a fixed key ("engine_version") or a dotted plan field ("load.max_concurrency")
    a: Any
    b: Any


def differences(a: RunAnalysis, b: RunAnalysis) -> list[Difference]:
    """What differs between the two runs' fixed parts and plans (the parts that make them different
    experiments: what the plan hash covers, and a rehearsal server's own settings)."""
    out = [Difference(k, a.run.fixed.get(k), b.run.fixed.get(k)) for k in FIXED_KEYS]
    out = [d for d in out if d.a != d.b]
    fa, fb = flatten(a.run.plan), flatten(b.run.plan)
    for key in sorted(set(fa) | set(fb)):
        if key.startswith(_PLAN_PARTS) and fa.get(key) != fb.get(key):
            out.append(Difference(key, fa.get(key), fb.get(key)))
    return out


def subject_of(diffs: Sequence[Difference], declared: str | None = None) -> Difference | None:
    """The one thing the runs differ in: the engine version, found on its own (a rehearsal server's
    `--engine-version` in its extra_args goes with it), or the *declared* variable (a fixed key or a
    plan field, every differing field under it). None: they differ in more than that, or in
    something else nobody declared (a different model is a different experiment unless said)."""
    if declared is not None:
        inside = [d for d in diffs if d.key == declared or d.key.startswith(declared + ".")]
        rest = [d for d in diffs if d not in inside]
        if not inside or rest:
            return None
        if len(inside) == 1:
            return inside[0]
        return Difference(declared, {d.key: d.a for d in inside}, {d.key: d.b for d in inside})
    version = [d for d in diffs if d.key == "engine_version"]
    rest = [d for d in diffs if d.key != "engine_version" and not _version_arg(d)]
    return version[0] if version and not rest else None


def _version_arg(d: Difference) -> bool:
    """A rehearsal server's --engine-version in its extra_args: the version itself, said twice."""
    return d.key == "target.sim.extra_args" and any(
        isinstance(v, list) and "--engine-version" in v for v in (d.a, d.b)
    )


@dataclass(frozen=True)
class MemoryChange:
    figure: str  # resident_model, kv_cache, runtime_overhead, peak
    measured_a: int | None
    measured_b: int | None
    predicted_a: int | None
    predicted_b: int | None
    source_a: str = ""
    source_b: str = ""

    @staticmethod
    def _d(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else b - a

    @property
    def measured_delta(self) -> int | None:
        return self._d(self.measured_a, self.measured_b)

    @property
    def predicted_delta(self) -> int | None:
        return self._d(self.predicted_a, self.predicted_b)


@dataclass(frozen=True)
class Regression:
    subject: Difference
    memory: list[MemoryChange]
    latency: list[MetricDelta]
    verdict: str  # regressed | improved | no change
    reasons: list[str] = field(default_factory=list)  # what made the verdict, worst first
    notes: list[str] = field(default_factory=list)


def _figure(comp: Composition, name: str) -> tuple[int | None, int | None, str]:
    """(measured, predicted, source) of one figure over the run: the peak and overhead at their
    highest window, the resident model and the pool as first measured."""
    values = [r.figure(name) for r in comp.rows]
    measured = [f for f in values if f.measured_bytes is not None]
    predicted = next((f.predicted_bytes for f in values if f.predicted_bytes is not None), None)
    if not measured:
        return None, predicted, ""
    if name in ("peak", "runtime_overhead"):
        top = max(measured, key=lambda f: f.measured_bytes or 0)
        return top.measured_bytes, predicted, top.source
    return measured[0].measured_bytes, predicted, measured[0].source


def memory_changes(ca: Composition, cb: Composition) -> list[MemoryChange]:
    out = []
    for name in FIGURES:
        ma, pa, sa = _figure(ca, name)
        mb, pb, sb = _figure(cb, name)
        if ma is None and mb is None and pa is None and pb is None:
            continue
        out.append(MemoryChange(name, ma, mb, pa, pb, sa, sb))
    return out


def _moved(base: float, now: float, rel: float, floor: float) -> bool:
    return abs(now - base) > max(rel * abs(base), floor)


def judge(
    memory: Sequence[MemoryChange],
    latency: Sequence[MetricDelta],
    counts: dict[tuple[str, str], float] | None = None,
) -> tuple[str, list[str]]:
    """The verdict and its reasons; *counts*: the fewer requests of the two runs per (phase, step)."""
    worse: list[str] = []
    better: list[str] = []
    for m in memory:
        if m.measured_a is None or m.measured_b is None or m.figure not in ("peak", "kv_cache"):
            continue
        if not _moved(m.measured_a, m.measured_b, MEMORY_REL, MEMORY_FLOOR_BYTES):
            continue
        gib = (m.measured_b - m.measured_a) / (1 << 30)
        line = f"{m.figure.replace('_', ' ')} {gib:+.2f} GiB measured"
        up = m.measured_b > m.measured_a
        (worse if up == (m.figure == "peak") else better).append(line)
    for d in latency:
        where = f"{d.phase}" + (f" {d.step}" if d.step else "")
        enough = counts is None or counts.get((d.phase, d.step), 0) >= MIN_REQUESTS
        if d.metric in LATENCY_METRICS and enough and _moved(d.a, d.b, LATENCY_REL, LATENCY_FLOOR_MS):
            line = f"{d.metric} {d.a:,.1f} -> {d.b:,.1f} ms ({(d.rel or 0) * 100:+.0f}%) in {where}"
            (worse if d.b > d.a else better).append(line)
        elif d.metric == "error_rate" and abs(d.b - d.a) > ERROR_FLOOR:
            line = f"error rate {d.a:.1%} -> {d.b:.1%} in {where}"
            (worse if d.b > d.a else better).append(line)
    if worse:
        return "regressed", worse + better
    return ("improved", better) if better else ("no change", [])


def regression(
    a: RunAnalysis, b: RunAnalysis, ca: Composition, cb: Composition, subject: Difference
) -> Regression:
    latency = [d for d in compare_runs(a, b).deltas if d.phase != "all"]
    memory = memory_changes(ca, cb)
    na, nb = requests_per_cell(a), requests_per_cell(b)
    counts = {k: min(na[k], nb[k]) for k in set(na) & set(nb)}
    verdict, reasons = judge(memory, latency, counts)
    notes = []
    rounds = min(len({w.window.round for w in x.phases}) for x in (a, b))
    if rounds < 3:
        notes.append(
            f"{rounds} round{'s' if rounds != 1 else ''} a run: a latency change is one window against one "
            "window, which a busy machine alone can move; three rounds or more tell a trend from noise"
        )
    if not any(m.measured_a is not None and m.measured_b is not None for m in memory):
        notes.append("neither memory figure was measured in both runs: sample gpu or ledger, and engine")
    return Regression(subject, memory, latency, verdict, reasons, notes)


__all__ = [
    "Difference",
    "MemoryChange",
    "Regression",
    "differences",
    "judge",
    "memory_changes",
    "regression",
    "subject_of",
]
