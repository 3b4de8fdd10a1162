"""Percentiles and per-window summaries of requests and samples: pure functions over records.

Percentile method: linear interpolation between closest ranks (Hyndman & Fan type 7), the
default of numpy.percentile and of vLLM's `bench serve`, so numbers line up with those tools.
For sorted values x[0..n-1] and p in [0, 100]: h = (n - 1) * p / 100, and the result is
x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]). It is monotone in p and always
within [min, max]. Sums use math.fsum so a summary does not depend on record order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from vramlab.records import RequestRecord, SampleRecord
from vramlab.records.stats import percentile

# Sample names whose interesting extreme is the minimum (health.ok drops to 0 when unhealthy).
MIN_IS_WORST = ("health.ok",)


@dataclass(frozen=True)
class Distribution:
    """P50/P90/P95/P99/max/mean of one latency in milliseconds over a set of requests."""

    count: int
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Distribution | None:
        xs = [v for v in values if v is not None and v == v]  # v == v drops NaN
        xs.sort()
        if not xs:
            return None
        return cls(
            count=len(xs),
            p50=percentile(xs, 50, is_sorted=True),
            p90=percentile(xs, 90, is_sorted=True),
            p95=percentile(xs, 95, is_sorted=True),
            p99=percentile(xs, 99, is_sorted=True),
            max=xs[-1],
            mean=math.fsum(xs) / len(xs),
        )


@dataclass(frozen=True)
class Window:
    """A stretch of the run, in seconds from run start, with the plan coordinates it belongs to."""

    round: int
    phase: str
    step: int | None  # None: the whole phase, every step of it
    start_s: float
    end_s: float
    step_value: float | None = None
    # Samples are read up to here: the next window's start when requests of this one drain into
    # it, so a step's resource maxima are not the next (heavier) step's.
    samples_end_s: float | None = None
    # The load generator's self-check (runner phase_end): who fell behind in this window, when its
    # latencies include the client's own lag; None when it kept up.
    client_lag: str | None = None

    @property
    def duration_s(self) -> float:
        return max(self.end_s - self.start_s, 0.0)

    @property
    def key(self) -> tuple[int, str, int | None]:
        return (self.round, self.phase, self.step)


# Above this share of untimed inter-token gaps a window's ITL is marked (report: "(ITL N% untimed)").
ITL_UNTIMED_WARN = 0.10


@dataclass(frozen=True)
class RequestSummary:
    """The user layer of one window: volume, errors, throughput and latency distributions.

    `*_sched` distributions are measured from the scheduled send time, so they include the
    time a request waited inside the client (coordinated omission); the others from the send.
    """

    count: int
    ok: int
    errors: int
    error_rate: float
    errors_by_class: dict[str, int]
    throughput_rps: float
    output_tok_s: float
    goodput_rps: float | None  # requests inside the SLO per second (None: no SLO given)
    ttft: Distribution | None
    tpot: Distribution | None
    itl: Distribution | None
    e2e: Distribution | None
    ttft_sched: Distribution | None
    e2e_sched: Distribution | None
    dispatch_lag: Distribution | None
    cancelled: int = 0  # cut off by the end of the window (or Ctrl-C): left out of every figure above
    # The gaps between token chunks of the successful requests: `itl` is built on `itl_timed` of
    # them; `itl_untimed` could not be timed (a token read together with later bytes), None when no
    # request stored the count (rows written before it was recorded).
    itl_timed: int = 0
    itl_untimed: int | None = None
    # successful requests whose output tokens were counted from stream chunks (the server sent no
    # usage and no count of its own): output_tok_s rests on an estimate for them
    tokens_estimated: int = 0
    goodput_tok_s: float | None = None  # the output tokens of the requests inside the SLO, per second

    @property
    def itl_untimed_share(self) -> float | None:
        """Share of the inter-token gaps that could not be timed; None when unknown or no gaps."""
        if self.itl_untimed is None or self.itl_timed + self.itl_untimed == 0:
            return None
        return self.itl_untimed / (self.itl_timed + self.itl_untimed)

    @property
    def itl_few_timed(self) -> bool:
        """More than ITL_UNTIMED_WARN of the gaps untimed: the ITL tail rests on the gaps left."""
        share = self.itl_untimed_share
        return share is not None and share > ITL_UNTIMED_WARN


@dataclass(frozen=True)
class SampleSummary:
    """The service and resource layers of one window: per sample name, max (min for health)."""

    worst: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Slo:
    """A request is 'good' when it succeeded and met every limit given (goodput, as in DistServe)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        for limit, value in ((self.ttft_ms, r.ttft_ms), (self.tpot_ms, r.tpot_ms), (self.e2e_ms, r.e2e_ms)):
            if limit is not None and (value is None or value > limit):
                return False
        return True


def is_ok(r: RequestRecord) -> bool:
    return r.error_class is None and 200 <= r.status_code < 300


def summarize_requests(
    reqs: Sequence[RequestRecord], duration_s: float, slo: Slo | None = None
) -> RequestSummary:
    """Summary of the requests of one window lasting *duration_s* seconds (every attempt counts).

    Requests the client itself cancelled say nothing about the target, so they are only counted.
    """
    cancelled = sum(1 for r in reqs if r.error_class == "cancelled")
    reqs = [r for r in reqs if r.error_class != "cancelled"]
    ok = [r for r in reqs if is_ok(r)]
    by_class: dict[str, int] = {}
    for r in reqs:
        if not is_ok(r):
            cls = r.error_class or f"http_{r.status_code}"
            by_class[cls] = by_class.get(cls, 0) + 1
    n = len(reqs)
    per_s = (1.0 / duration_s) if duration_s > 0 else 0.0
    out_tokens = math.fsum(float(r.output_tokens or 0) for r in ok)
    known = [r.itl_untimed_gaps for r in ok if r.itl_untimed_gaps is not None]
    good = good_tok = None
    if slo is not None:
        inside = [r for r in ok if slo.met_by(r)]
        good = len(inside) * per_s
        good_tok = math.fsum(float(r.output_tokens or 0) for r in inside) * per_s
    return RequestSummary(
        count=n,
        ok=len(ok),
        errors=n - len(ok),
        error_rate=(n - len(ok)) / n if n else 0.0,
        errors_by_class=dict(sorted(by_class.items())),
        throughput_rps=len(ok) * per_s,
        output_tok_s=out_tokens * per_s,
        goodput_rps=good,
        ttft=Distribution.of(r.ttft_ms for r in ok),
        tpot=Distribution.of(r.tpot_ms for r in ok),
        itl=Distribution.of(x for r in ok for x in r.itl_ms),
        e2e=Distribution.of(r.e2e_ms for r in ok),
        ttft_sched=Distribution.of(r.ttft_from_scheduled_ms for r in ok),
        e2e_sched=Distribution.of(r.e2e_from_scheduled_ms for r in ok),
        dispatch_lag=Distribution.of(r.dispatch_lag_ms for r in reqs),
        cancelled=cancelled,
        itl_timed=sum(len(r.itl_ms) for r in ok),
        itl_untimed=sum(known) if known else None,
        tokens_estimated=sum(1 for r in ok if r.output_tokens_source == "chunks"),
        goodput_tok_s=good_tok,
    )


def summarize_samples(samples: Iterable[SampleRecord], start_s: float, end_s: float) -> SampleSummary:
    """Worst value per sample name within [start_s, end_s] (max; min for health-style names)."""
    worst: dict[str, float] = {}
    count: dict[str, int] = {}
    for s in samples:
        if not start_s <= s.t_s <= end_s or math.isnan(s.value):
            continue
        count[s.name] = count.get(s.name, 0) + 1
        prev = worst.get(s.name)
        pick = min if s.name in MIN_IS_WORST else max
        worst[s.name] = s.value if prev is None else pick(prev, s.value)
    return SampleSummary(worst=dict(sorted(worst.items())), count=dict(sorted(count.items())))


def request_span(reqs: Iterable[RequestRecord]) -> tuple[float, float] | None:
    """First scheduled/sent time and last end time of some requests, or None if they have none."""
    starts = [
        t for r in reqs for t in (r.scheduled_s if r.scheduled_s is not None else r.sent_s,) if t is not None
    ]
    ends = [t for r in reqs for t in (r.end_s, r.sent_s) if t is not None]
    if not starts or not ends:
        return None
    return min(starts), max(max(ends), min(starts))
