"""The retry wave on recovery: attempts per second against the baseline's offered rate, watched live.

When a target comes back, every client that was failing retries at once (immediate policy) or
spread out (jittered back-off). A wave well above the baseline request rate is a thundering herd,
and a herd that knocks the target over again is the worst outcome a drill can find.

Only the policy's retries make a storm: a closed-loop user whose request failed at once
sends its *next* request sooner, which raises the attempt rate without a single retry. A window
counts as a storm when its attempt rate is `threshold` x the baseline's and at least half of its
attempts are retries (attempt > 0). The stored figures split the two (analysis/incident.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class HerdMonitor:
    window_s: float = 1.0
    threshold: float = 2.0  # amplification that counts as a storm
    _baseline: list[float] = field(default_factory=list)
    _recent: deque[tuple[float, bool]] = field(default_factory=deque)  # (sent, is a retry)
    peak_amplification: float = 0.0
    peak_t_s: float | None = None
    storm_at_s: float | None = None

    def on_attempt(self, t_s: float, phase: str, attempt: int = 0) -> float | None:
        """Count one attempt; returns the amplification when a storm is first seen."""
        if phase == "baseline":
            if attempt == 0:  # the offered rate: original requests only
                self._baseline.append(t_s)
            return None
        if phase != "recovery":
            return None
        self._recent.append((t_s, attempt > 0))
        while self._recent and self._recent[0][0] < t_s - self.window_s:
            self._recent.popleft()
        base = self.baseline_rate_rps()
        if not base:
            return None
        amp = (len(self._recent) / self.window_s) / base
        if amp > self.peak_amplification:
            self.peak_amplification, self.peak_t_s = amp, t_s
        retries = sum(1 for _, r in self._recent if r)
        if amp >= self.threshold and 2 * retries >= len(self._recent) and self.storm_at_s is None:
            self.storm_at_s = t_s
            return amp
        return None

    def baseline_rate_rps(self) -> float | None:
        if len(self._baseline) < 2:
            return None
        span = self._baseline[-1] - self._baseline[0]
        return (len(self._baseline) - 1) / span if span > 0 else None


__all__ = ["HerdMonitor"]
