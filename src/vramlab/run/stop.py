"""Stop conditions: checked continuously, always armed, the wall clock one always on.

Request conditions (error rate, P95) look at a sliding window of the last ``window_s`` seconds
and wait for ``min_requests`` so one early failure cannot stop a run, with one exception: when
every request in the window timed out, the error-rate stop fires however few there are (a target
that never answers sends few results, one per timeout per user). Sample conditions (KV usage,
GPU memory share) use the latest value from any source. OOM fires on the first sighting.
Requests cancelled by the runner itself are not errors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from vramlab.plandoc import StopConditions
from vramlab.records.stats import percentile


@dataclass(frozen=True)
class StopReason:
    condition: str  # error_rate | p95_ms | kv_usage | gpu_memory_share | oom_seen | wall_clock_s
    value: float
    threshold: float
    message: str


class StopMonitor:
    def __init__(self, conditions: StopConditions, wall_clock_s: float) -> None:
        self.c, self.wall_clock_s = conditions, wall_clock_s
        self._window: deque[tuple[float, bool, float | None, bool]] = (
            deque()
        )  # (end_s, ok, e2e_sched_ms, timed out)
        self._latest: dict[str, dict[str, float]] = {}  # name -> label key -> value
        self._oom: str | None = None
        self._errors = 0  # failures now in the window, kept as requests enter and leave
        self._timeouts = 0  # timeouts now in the window
        self._p95_at = -1.0  # the P95 is re-sorted at most every P95_EVERY_S (it is O(n log n))
        self._p95: float | None = None

    P95_EVERY_S = 0.5

    def reset_requests(self) -> None:
        """Forget the request window (a ramp that absorbed a stop starts recovery afresh)."""
        self._window.clear()
        self._errors = 0
        self._timeouts = 0
        self._p95_at, self._p95 = -1.0, None

    def on_request(
        self,
        end_s: float,
        ok: bool,
        error_class: str | None,
        e2e_from_scheduled_ms: float | None,
        error: str | None = None,
    ) -> None:
        if error_class == "cancelled":
            return
        if error_class == "oom" and self._oom is None:
            self._oom = f"a request failed with an out-of-memory error: {error or ''}".strip()[:200]
        timed_out = error_class == "timeout"
        self._window.append((end_s, ok, e2e_from_scheduled_ms if ok else None, timed_out))
        self._errors += 0 if ok else 1
        self._timeouts += 1 if timed_out else 0

    def on_sample(self, name: str, value: float, key: str = "") -> None:
        self._latest.setdefault(name, {})[key] = value

    def on_oom(self, message: str) -> None:
        """An OOM seen elsewhere (engine log, the sim's ledger, a drill's detector)."""
        if self._oom is None:
            self._oom = message[:200]

    def _prune(self, now_s: float) -> None:
        cutoff = now_s - self.c.window_s
        while self._window and self._window[0][0] < cutoff:
            _, ok, _, timed_out = self._window.popleft()
            self._errors -= 0 if ok else 1
            self._timeouts -= 1 if timed_out else 0

    def _max_latest(self, *names: str) -> float | None:
        vals = [v for n in names for v in self._latest.get(n, {}).values()]
        return max(vals) if vals else None

    def check(self, now_s: float) -> StopReason | None:
        c = self.c
        if now_s >= self.wall_clock_s:
            return StopReason(
                "wall_clock_s",
                now_s,
                self.wall_clock_s,
                f"wall clock: {now_s:.0f} s reached the limit of {self.wall_clock_s:g} s",
            )
        if c.oom_seen and self._oom is not None:
            return StopReason("oom_seen", 1.0, 1.0, f"OOM seen: {self._oom}")
        self._prune(now_s)
        n = len(self._window)
        if c.error_rate is not None and 0 < n < c.min_requests and self._timeouts == n:
            return StopReason(
                "error_rate",
                1.0,
                c.error_rate,
                f"every request in the last {c.window_s:g} s timed out ({n}/{n}): the target "
                "accepts requests but does not answer",
            )
        if n >= c.min_requests:
            if c.error_rate is not None:
                errors = self._errors
                rate = errors / n
                if rate > c.error_rate:
                    timeouts = f", {self._timeouts} timed out" if self._timeouts else ""
                    return StopReason(
                        "error_rate",
                        rate,
                        c.error_rate,
                        f"error rate {rate:.0%} over the last {c.window_s:g} s "
                        f"({errors}/{n}{timeouts}) is above {c.error_rate:.0%}",
                    )
            if c.p95_ms is not None:
                if now_s - self._p95_at >= self.P95_EVERY_S:
                    lat = [e for _, ok, e, _ in self._window if ok and e is not None]
                    self._p95 = percentile(lat, 95) if len(lat) >= c.min_requests else None
                    self._p95_at = now_s
                p95 = self._p95
                if p95 is not None:
                    if p95 > c.p95_ms:
                        return StopReason(
                            "p95_ms",
                            p95,
                            c.p95_ms,
                            f"P95 end-to-end latency {p95:.0f} ms over the last {c.window_s:g} s "
                            f"is above {c.p95_ms:g} ms",
                        )
        if c.kv_usage is not None:
            kv = self._max_latest("engine.kv_cache_usage_perc")
            if kv is not None and kv >= c.kv_usage:
                return StopReason(
                    "kv_usage", kv, c.kv_usage, f"KV cache usage {kv:.1%} reached {c.kv_usage:.1%}"
                )
        if c.gpu_memory_share is not None:
            share = self._max_latest("gpu.memory_share")
            if share is not None and share >= c.gpu_memory_share:
                return StopReason(
                    "gpu_memory_share",
                    share,
                    c.gpu_memory_share,
                    f"GPU memory {share:.1%} of the card reached {c.gpu_memory_share:.1%}",
                )
        return None
