"""Engine statistics, and their `/metrics` rendering under each engine's own metric names.

The engine updates plain counters (`EngineStats`); the names are chosen only at scrape time, by
one collector per engine, because the same signal is `vllm:num_requests_running`,
`sglang:num_running_reqs`, `tgi_batch_current_size` or `llamacpp:requests_processing`
(docs/research/drill-anchors.md §3). vLLM before 0.10 says `gpu_cache_usage_perc` and
`time_per_output_token_seconds`; later releases say `kv_cache_usage_perc` and
`inter_token_latency_seconds`.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

LATENCY_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)


@dataclass
class Histogram:
    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += c
            out.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        return out


@dataclass
class EngineStats:
    """What the engine counts. Gauges are read live from the engine through callables."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    success: Counter[str] = field(default_factory=Counter)  # finished_reason -> count
    failures: Counter[str] = field(default_factory=Counter)  # TGI err label -> count
    requests: int = 0
    ttft_s: Histogram = field(default_factory=Histogram)
    itl_s: Histogram = field(default_factory=Histogram)
    e2e_s: Histogram = field(default_factory=Histogram)
    queue_s: Histogram = field(default_factory=Histogram)
    prompt_seconds: float = 0.0  # llama.cpp's time spent on prompts and on generation
    predicted_seconds: float = 0.0


@dataclass(frozen=True)
class Gauges:
    running: Callable[[], int]
    waiting: Callable[[], int]
    kv_usage: Callable[[], float]
    kv_used_tokens: Callable[[], int]
    kv_total_tokens: int
    cache_config: dict[str, str]
    prefix_cache: Any = None  # a sim.prefix_cache.PrefixCache when prefix caching is on


class EngineCollector:
    """A prometheus_client collector rendering `EngineStats` in one engine's names."""

    def __init__(self, engine: str, version: tuple[int, ...], model: str, stats: EngineStats, gauges: Gauges):
        self.engine, self.version, self.model, self.stats, self.gauges = engine, version, model, stats, gauges

    def collect(self) -> Iterator[Any]:
        render = {"vllm": self._vllm, "sglang": self._sglang, "tgi": self._tgi, "llama.cpp": self._llamacpp}
        yield from render[self.engine]()

    # --- helpers ------------------------------------------------------------------------
    def _counter(
        self, name: str, doc: str, value: float, labels: dict[str, str] | None = None, suffix: str = "_total"
    ) -> Any:
        from prometheus_client.core import Metric

        m = Metric(name, doc, "counter")
        m.add_sample(name + suffix, labels or {}, value)
        return m

    def _gauge(self, name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily(name, doc, labels=list(labels or {}))
        g.add_metric(list((labels or {}).values()), value)
        return g

    def _hist(self, name: str, doc: str, h: Histogram, labels: dict[str, str] | None = None) -> Any:
        from prometheus_client.core import HistogramMetricFamily

        m = HistogramMetricFamily(name, doc, labels=list(labels or {}))
        m.add_metric(list((labels or {}).values()), h.cumulative(), h.total)
        return m

    # --- engines ------------------------------------------------------------------------
    def _vllm(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        s, g = self.stats, self.gauges
        lab = {"model_name": self.model, "engine": "0"}
        new = self.version >= (0, 10)
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", g.running(), lab
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", g.waiting(), lab
        )
        usage = "vllm:kv_cache_usage_perc" if new else "vllm:gpu_cache_usage_perc"
        yield self._gauge(usage, "KV-cache usage. 1 means 100 percent usage.", g.kv_usage(), lab)
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions, lab
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens, lab)
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens, lab
        )
        ok = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*lab, "finished_reason"],
        )
        for reason in ("stop", "length", "abort"):
            ok.add_metric([*lab.values(), reason], s.success[reason])
        yield ok
        yield self._hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft_s, lab
        )
        itl = "vllm:inter_token_latency_seconds" if new else "vllm:time_per_output_token_seconds"
        yield self._hist(itl, "Histogram of inter-token latency in seconds.", s.itl_s, lab)
        yield self._hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e_s, lab
        )
        yield self._hist(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase.", s.queue_s, lab
        )
        yield self._gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", 1.0, g.cache_config
        )
        yield from self._vllm_prefix(lab)

    def _vllm_prefix(self, lab: dict[str, str]) -> Iterator[Any]:
        """vLLM's prefix cache figures by release (vllm/v1/metrics/loggers.py): the token counters
        ``prefix_cache_queries`` / ``prefix_cache_hits`` from 0.9 (renamed from ``gpu_prefix_cache_*``,
        V1's names in 0.8); V0 exported a block hit rate gauge, ``gpu_prefix_cache_hit_rate``."""
        cache = self.gauges.prefix_cache
        if cache is None:
            return
        if self.version < (0, 8):
            yield self._gauge(
                "vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", cache.hit_rate, lab
            )
            return
        prefix = "vllm:" if self.version >= (0, 9) else "vllm:gpu_"
        yield self._counter(
            prefix + "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            cache.queries_tokens,
            lab,
        )
        yield self._counter(
            prefix + "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            cache.hits_tokens,
            lab,
        )

    def _sglang(self) -> Iterator[Any]:
        s, g = self.stats, self.gauges
        lab = {"model_name": self.model}
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", g.running(), lab)
        yield self._gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", g.waiting(), lab
        )
        yield self._gauge("sglang:token_usage", "The token usage.", g.kv_usage(), lab)
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.", g.kv_used_tokens(), lab)
        yield self._counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens, lab
        )
        yield self._counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", s.generation_tokens, lab
        )
        yield self._counter("sglang:num_retracted_reqs", "Number of retracted requests.", s.preemptions, lab)
        if g.prefix_cache is not None:  # sglang/srt/metrics/collector.py: the radix cache's hit rate
            yield self._gauge(
                "sglang:cache_hit_rate", "The prefix cache hit rate.", g.prefix_cache.hit_rate, lab
            )
        yield self._hist(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            s.ttft_s,
            lab,
        )
        yield self._hist(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl_s, lab
        )
        yield self._hist(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            s.e2e_s,
            lab,
        )

    def _tgi(self) -> Iterator[Any]:
        # TGI's Rust exporter writes counters without a `_total` suffix.
        from prometheus_client.core import Metric

        s, g = self.stats, self.gauges
        yield self._gauge("tgi_queue_size", "", g.waiting())
        yield self._gauge("tgi_batch_current_size", "", g.running())
        yield self._gauge("tgi_batch_current_max_tokens", "", g.kv_used_tokens())
        yield self._gauge("tgi_batch_max_total_tokens", "", g.kv_total_tokens)
        yield self._counter("tgi_request_count", "", s.requests, suffix="")
        yield self._counter("tgi_request_success", "", sum(s.success.values()), suffix="")
        fail = Metric("tgi_request_failure", "", "counter")
        for err, n in sorted(s.failures.items()):
            fail.add_sample("tgi_request_failure", {"err": err}, n)
        yield fail
        yield self._hist("tgi_request_duration", "", s.e2e_s)
        yield self._hist("tgi_request_queue_duration", "", s.queue_s)
        yield self._hist("tgi_request_mean_time_per_token_duration", "", s.itl_s)

    def _llamacpp(self) -> Iterator[Any]:
        s, g = self.stats, self.gauges
        yield self._counter("llamacpp:prompt_tokens", "Number of prompt tokens processed.", s.prompt_tokens)
        yield self._counter("llamacpp:prompt_seconds", "Prompt process time", s.prompt_seconds)
        yield self._counter(
            "llamacpp:tokens_predicted", "Number of generation tokens processed.", s.generation_tokens
        )
        yield self._counter("llamacpp:tokens_predicted_seconds", "Predict process time", s.predicted_seconds)
        pps = s.prompt_tokens / s.prompt_seconds if s.prompt_seconds else 0.0
        tps = s.generation_tokens / s.predicted_seconds if s.predicted_seconds else 0.0
        yield self._gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.", pps)
        yield self._gauge(
            "llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.", tps
        )
        yield self._gauge(
            "llamacpp:kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", g.kv_usage()
        )
        yield self._gauge("llamacpp:kv_cache_tokens", "KV-cache tokens.", g.kv_used_tokens())
        yield self._gauge("llamacpp:requests_processing", "Number of requests processing.", g.running())
        yield self._gauge("llamacpp:requests_deferred", "Number of requests deferred.", g.waiting())


def render(collector: EngineCollector) -> bytes:
    """The Prometheus text exposition of one collector (its own registry: no process metrics mixed in)."""
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return generate_latest(reg)
