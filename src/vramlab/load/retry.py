"""Retry policies: none, immediate, or exponential back-off with jitter.

A drill replays its load both ways, since immediate retries are what turn a recovery into a
thundering herd, and jittered back-off is what should prevent it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

# Worth retrying: the server was busy, briefly gone, or too slow; a 4xx other than 429 will not change.
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
RETRYABLE_ERRORS = frozenset({"timeout", "connect", "stream_broken", "http_5xx", "oom"})


@dataclass(frozen=True)
class RetryPolicy:
    policy: Literal["none", "immediate", "exponential"] = "none"
    max_attempts: int = 3
    base_s: float = 0.5
    max_s: float = 10.0
    jitter: float = 1.0

    def should_retry(self, attempt: int, status_code: int, error_class: str | None) -> bool:
        """``attempt`` is the 0-based attempt that just failed."""
        if self.policy == "none" or attempt + 1 >= self.max_attempts:
            return False
        if error_class == "cancelled":
            return False
        return status_code in RETRYABLE_STATUS or error_class in RETRYABLE_ERRORS

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Wait before attempt ``attempt + 1``: capped exponential, the jittered part drawn uniformly."""
        if self.policy != "exponential":
            return 0.0
        full: float = min(self.max_s, self.base_s * (2**attempt))
        return full * (1 - self.jitter) + rng.uniform(0, full * self.jitter)

    def user_backoff_s(self, failures: int, rng: random.Random) -> float:
        """How long a closed-loop user waits after its ``failures``-th failure in a row, whatever
        the policy: the policy's capped exponential, drawn from its upper half (never ~0)."""
        full: float = min(self.max_s, self.base_s * (2 ** max(0, failures - 1)))
        return full * rng.uniform(0.5, 1.0)
