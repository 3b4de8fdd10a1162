"""`change.search` as the runner's step strategy: each treatment window is a probe of the SLO
search (analysis/slo_search.py), judged on its own stored request rows; every probe and the answer
go on the run's timeline (`search_probe`, `search_result` events), so the report reads them back."""

from __future__ import annotations

from vramlab.analysis.slo_search import SloSearch, probe
from vramlab.experiment.plan import Plan
from vramlab.records import RequestRecord
from vramlab.records import emit as E
from vramlab.records.emit import Emitter
from vramlab.run.steps import StepOutcome


class SearchSteps:
    """The values a search probes, one treatment step each; the kind hands it the step's records."""

    def __init__(self, plan: Plan, emit: Emitter) -> None:
        s = plan.change.search
        assert s is not None
        self.spec, self.emit = s, emit
        self.variable = plan.change.variable
        self.open_loop = plan.load.mode == "open"
        self.search = SloSearch(s.low, s.high, self.variable == "concurrency", s.resolution, s.max_probes)
        self._records: dict[int, list[RequestRecord]] = {}

    def add(self, rec: RequestRecord) -> None:
        """A treatment request's stored row (cancelled ones say nothing about the target)."""
        if rec.phase == "treatment" and rec.error_class != "cancelled":
            self._records.setdefault(rec.step, []).append(rec)

    def first(self) -> float | None:
        self._records.clear()
        return self.search.first()

    def next(self, outcome: StepOutcome) -> float | None:
        if outcome.stopped is not None:
            return None  # a stop condition ended the run: no more probes
        records = self._records.pop(outcome.index, [])
        p = probe(
            outcome.value,
            records,
            self.spec.slo,
            self.spec.min_requests,
            self.search.below(outcome.value),
            self.open_loop,
            self.search.best_per_user(outcome.value),
        )
        nxt = self.search.next(p)
        verdict = "meets the SLO" if p.meets else "fails: " + ", ".join(p.failed)
        self.emit(
            E.SEARCH_PROBE(
                f"search probe {outcome.index}: {self.variable} {outcome.value:g} {verdict}"
                + (" (its halves disagree: probed again)" if p.unstable and nxt == p.value else ""),
                {"step": outcome.index, "variable": self.variable, "slo": dict(self.spec.slo), **p.to_json()},
            )
        )
        if nxt is None:
            lo, hi = self.search.bracket
            said = "none meets it" if lo is None else f"{lo:g}"
            self.emit(
                E.SEARCH_RESULT(
                    f"search: the largest {self.variable} meeting the SLO is {said} (bracket {_v(lo)} to "
                    f"{_v(hi)}; {len(self.search.probes)} probes; {self.search.reason})",
                    {
                        "variable": self.variable,
                        "answer": lo,
                        "bracket": [lo, hi],
                        "slo": dict(self.spec.slo),
                        "probes": len(self.search.probes),
                        "reason": self.search.reason,
                    },
                )
            )
        return nxt


def _v(v: float | None) -> str:
    return "–" if v is None else f"{v:g}"


__all__ = ["SearchSteps"]
