"""Across phases and rounds: baseline vs treatment vs recovery, stability, return to baseline."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from vramlab.analysis.stats import is_ok
from vramlab.analysis.windows import PHASE_ORDER, WindowResult
from vramlab.records import RequestRecord
from vramlab.records.stats import percentile

# Metrics compared between phases and checked for stability, in report order.
KEY_METRICS = (
    "e2e_p95_ms",
    "ttft_p95_ms",
    "tpot_p95_ms",
    "e2e_sched_p95_ms",
    "error_rate",
    "throughput_rps",
    "output_tok_s",
    "gpu.memory_used_bytes",
    "engine.kv_cache_usage_perc",
    "engine.num_requests_waiting",
)

# Below these absolute differences a change is noise, whatever the relative size.
ABS_FLOOR = {"error_rate": 0.01, "throughput_rps": 0.5, "output_tok_s": 5.0}
LATENCY_FLOOR_MS = 5.0


def abs_floor(metric: str) -> float:
    return ABS_FLOOR.get(metric, LATENCY_FLOOR_MS if metric.endswith("_ms") else 0.0)


@dataclass(frozen=True)
class Delta:
    baseline: float
    value: float

    @property
    def delta(self) -> float:
        return self.value - self.baseline

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None


@dataclass(frozen=True)
class RoundComparison:
    """One round's phases side by side, with each phase's delta from that round's baseline."""

    round: int
    phases: dict[str, WindowResult]
    deltas: dict[str, dict[str, Delta]]  # phase -> metric -> delta


def compare_phases(phase_results: Sequence[WindowResult]) -> list[RoundComparison]:
    by_round: dict[int, dict[str, WindowResult]] = {}
    for res in phase_results:
        by_round.setdefault(res.window.round, {})[res.window.phase] = res
    out = []
    for rnd in sorted(by_round):
        phases = by_round[rnd]
        deltas: dict[str, dict[str, Delta]] = {}
        base = phases.get("baseline")
        if base is not None:
            bm = base.metrics()
            for name, res in phases.items():
                if name == "baseline":
                    continue
                m = res.metrics()
                deltas[name] = {k: Delta(bm[k], m[k]) for k in KEY_METRICS if k in bm and k in m}
        out.append(RoundComparison(rnd, phases, deltas))
    return out


@dataclass(frozen=True)
class Stability:
    """One metric of one (phase, step) across rounds: spread, and rounds that stand out alone."""

    phase: str
    step: int | None
    metric: str
    by_round: dict[int, float]
    median: float
    spread: float  # max - min
    rel_spread: float | None  # spread / |median|
    spikes: list[int] = field(default_factory=list)  # the one round that deviates while the others agree
    rel_tol: float = 0.3

    @property
    def unstable(self) -> bool:
        """Rounds disagree beyond tolerance with no single culprit."""
        return not self.spikes and self.rel_spread is not None and self.rel_spread > self.rel_tol


def stability(results: Sequence[WindowResult], rel_tol: float = 0.3) -> list[Stability]:
    """Per (phase, step) and key metric, how much rounds differ.

    A round is a one-off spike when it is further than max(rel_tol x median, floor) from the
    median of the other rounds while those others all sit within that tolerance, and it is the
    only such round; it needs at least three rounds to say so.
    """
    cells: dict[tuple[str, int | None], dict[int, dict[str, float]]] = {}
    for res in results:
        w = res.window
        cells.setdefault((w.phase, w.step), {})[w.round] = res.metrics()
    out = []
    order = sorted(cells, key=lambda k: (PHASE_ORDER.get(k[0], 9), k[0], -1 if k[1] is None else k[1]))
    for phase, step in order:
        rounds = cells[(phase, step)]
        for metric in KEY_METRICS:
            by_round = {r: m[metric] for r, m in sorted(rounds.items()) if metric in m}
            if len(by_round) < 2:
                continue
            vals = list(by_round.values())
            med = statistics.median(vals)
            spread = max(vals) - min(vals)
            spikes: list[int] = []
            if len(vals) >= 3:
                lone = [r for r in by_round if _stands_alone(r, by_round, rel_tol, abs_floor(metric))]
                # Two rounds "standing alone" means no two rounds agree: that is noise, not a one-off.
                spikes = lone if len(lone) == 1 else []
            out.append(
                Stability(
                    phase,
                    step,
                    metric,
                    by_round,
                    med,
                    spread,
                    spread / abs(med) if med else None,
                    spikes,
                    rel_tol,
                )
            )
    return out


def _stands_alone(rnd: int, by_round: dict[int, float], rel_tol: float, floor: float) -> bool:
    others = [x for r, x in by_round.items() if r != rnd]
    m = statistics.median(others)
    tol = max(rel_tol * abs(m), floor)
    return abs(by_round[rnd] - m) > tol and all(abs(x - m) <= tol for x in others)


@dataclass(frozen=True)
class Recovery:
    """Did the recovery phase get back to the round's baseline, and how long after it began."""

    round: int
    returned: bool
    after_s: float | None
    baseline_e2e_p95_ms: float | None
    recovery_e2e_p95_ms: float | None
    baseline_error_rate: float
    recovery_error_rate: float
    reason: str
    judged: bool = True  # False: too few requests (or none) to say either way


def _within(value: float, baseline: float, rel_tol: float, floor: float) -> bool:
    return value <= baseline + max(rel_tol * abs(baseline), floor)


# Fewer requests than this in the recovery window (or in the part of it judged) leave the verdict
# open: a P95 over a handful of requests swings by tens of percent from one round to the next.
MIN_REQUESTS_TO_JUDGE = 10


def returned_to_baseline(
    baseline: WindowResult,
    recovery: WindowResult,
    recovery_requests: Sequence[RequestRecord],
    rel_tol: float = 0.2,
    bins: int = 10,
) -> Recovery:
    """Recovery vs baseline on P95 end-to-end latency and error rate.

    Judged on whole stretches of the recovery window, never on its last few requests: the window
    is cut into `bins` time bins (each at least 0.5 s), and "when" is the start of the earliest bin
    from which *all the requests to the end* together are within tolerance of the baseline (P95
    within rel_tol or 5 ms, error rate within 1 point), counting only stretches of at least
    MIN_REQUESTS_TO_JUDGE requests. Fewer than that in the whole window: too few to judge (said so,
    not returned). No such stretch: not returned.
    """
    b, r = baseline.requests, recovery.requests
    b_p95 = b.e2e.p95 if b.e2e else None
    r_p95 = r.e2e.p95 if r.e2e else None
    rnd = recovery.window.round

    def verdict(returned: bool, after: float | None, reason: str, judged: bool = True) -> Recovery:
        return Recovery(rnd, returned, after, b_p95, r_p95, b.error_rate, r.error_rate, reason, judged)

    if r.count == 0:
        return verdict(False, None, "no requests in the recovery phase", judged=False)
    done = [q for q in recovery_requests if q.error_class != "cancelled"]
    if done and not any(is_ok(q) for q in done):
        # every request failed (a hang: every one timed out): nothing came back, whatever the baseline did
        timed_out = sum(1 for q in done if q.error_class == "timeout")
        return verdict(
            False,
            None,
            f"no request succeeded in recovery ({len(done)} failed"
            + (f", {timed_out} timed out)" if timed_out else ")"),
        )
    lat_ok = b_p95 is None or (r_p95 is not None and _within(r_p95, b_p95, rel_tol, LATENCY_FLOOR_MS))
    err_ok = _within(r.error_rate, b.error_rate, 0.0, ABS_FLOOR["error_rate"])
    start, length = recovery.window.start_s, recovery.window.duration_s
    bin_s = max(length / bins, 0.5)
    n_bins = max(1, math.ceil(length / bin_s)) if length > 0 else 1
    buckets: list[list[RequestRecord]] = [[] for _ in range(n_bins)]
    for q in done:
        t = q.end_s if q.end_s is not None else q.sent_s
        if t is None:
            continue
        buckets[min(max(int((t - start) / bin_s), 0), n_bins - 1)].append(q)
    counted = sum(len(x) for x in buckets)
    if counted < MIN_REQUESTS_TO_JUDGE:
        return verdict(
            False,
            None,
            f"too few requests to judge: {counted} in the recovery window, {MIN_REQUESTS_TO_JUDGE} needed",
            judged=False,
        )

    def stretch_ok(reqs: list[RequestRecord]) -> bool:
        if not any(is_ok(q) for q in reqs):
            return False  # a stretch where nothing succeeded is never "back"
        errs = sum(1 for q in reqs if not is_ok(q)) / len(reqs)
        if not _within(errs, b.error_rate, 0.0, ABS_FLOOR["error_rate"]):
            return False
        lats = [q.e2e_ms for q in reqs if is_ok(q) and q.e2e_ms is not None]
        return b_p95 is None or not lats or _within(percentile(lats, 95), b_p95, rel_tol, LATENCY_FLOOR_MS)

    settled_from: int | None = None
    for i in range(n_bins):
        rest = [q for bucket in buckets[i:] for q in bucket]
        if len(rest) < MIN_REQUESTS_TO_JUDGE:
            break  # later stretches hold fewer still
        if buckets[i] and stretch_ok(rest):
            settled_from = i
            break
    if settled_from is None:
        why = []
        if not lat_ok:
            why.append(f"recovery P95 {_ms(r_p95)} vs baseline {_ms(b_p95)}")
        if not err_ok:
            why.append(f"recovery error rate {r.error_rate:.1%} vs baseline {b.error_rate:.1%}")
        return verdict(
            False, None, "; ".join(why) or "no stretch to the end of recovery is back within tolerance"
        )
    after = settled_from * bin_s
    if lat_ok and err_ok:
        return verdict(True, after, "P95 and error rate within tolerance of baseline")
    return verdict(
        True, after, f"back within tolerance {after:.1f} s into recovery (the phase as a whole was not)"
    )


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"
