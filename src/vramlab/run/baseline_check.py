"""Baseline sanity: a run or drill whose baseline already breaches its own error threshold stops
before the change, and says why in the server's words.

A change measured against a broken baseline measures nothing: when every baseline request fails
(an endpoint that answers the completions API with something that is not a stream, a wrong model
name) or none comes back at all (a target that accepts connections and never answers), ramping
would report the first step as the fault, or a ceiling the target never held.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class BaselineTally:
    """Counts one baseline window's requests as they end (cancelled ones apart: still open when
    the window closed, they never came back)."""

    error_rate_limit: float | None  # the plan's stop.error_rate; None: only "nothing succeeded" breaks it
    sent: int = 0
    ok: int = 0
    failed: int = 0
    still_open: int = 0
    classes: Counter[str] = field(default_factory=Counter)
    first_error: str | None = None  # the server's own words, as the request recorded them

    def add(self, ok: bool, error_class: str | None, status_code: int | None, error: str | None) -> None:
        self.sent += 1
        if error_class == "cancelled":
            self.still_open += 1
        elif ok:
            self.ok += 1
        else:
            self.failed += 1
            self.classes[error_class or f"http_{status_code}"] += 1
            if self.first_error is None and error:
                self.first_error = " ".join(error.split())[:240]

    def broken(self) -> str | None:
        """Why the baseline cannot serve as one, or None when it can."""
        done = self.ok + self.failed
        if self.sent == 0:
            return "the baseline sent no request"
        if done == 0:
            return (
                f"no baseline request came back: {self.still_open} of {self.sent} were still open when the "
                "window ended (a target that accepts connections and never answers, or a request timeout "
                "longer than the baseline)"
            )
        share = self.failed / done
        if self.ok == 0 or (self.error_rate_limit is not None and share >= self.error_rate_limit):
            classes = ", ".join(f"{k} {v}" for k, v in sorted(self.classes.items()))
            limit = (
                ""
                if self.error_rate_limit is None
                else f", at or past the error-rate stop {self.error_rate_limit:.0%}"
            )
            words = f"; the server said: {self.first_error}" if self.first_error else ""
            return f"{self.failed} of {done} baseline requests failed ({classes}{limit}){words}"
        return None

    def failures(self, whose: str) -> str:
        """What failed, in words: "3 of 40 {whose} requests had failed (http_4xx 3); the server said: ..."."""
        classes = ", ".join(f"{k} {v}" for k, v in sorted(self.classes.items()))
        return f"{self.failed} of {self.ok + self.failed} {whose} requests had failed ({classes})" + (
            f"; the server said: {self.first_error}" if self.first_error else ""
        )


__all__ = ["BaselineTally"]
