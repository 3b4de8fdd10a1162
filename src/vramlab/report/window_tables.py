"""The per-window tables of a report (one row per round and phase, or per step): the signals
the section promises side by side, then the latency detail; and the lines that qualify their
figures (the host's own load, output tokens counted from chunks, ITL gaps that could not be timed)."""

from __future__ import annotations

from vramlab.analysis.stats import ITL_UNTIMED_WARN, RequestSummary
from vramlab.analysis.windows import PHASE_ORDER, WindowResult
from vramlab.report import fmt
from vramlab.report.blocks import Block, Table, Text
from vramlab.report.sections import ReportContext

# The per-round and per-step figures, split in two tables that each fit a laptop screen: the
# signals the section promises side by side (errors, P95 and its change, queue, KV cache, GPU
# memory), then the latency detail.
_SIGNALS = [
    "requests",
    "err %",
    "req/s",
    "E2E P95 ms",
    "Δ E2E P95 vs baseline ms",
    "waiting max",
    "KV max",
    "GPU mem max GiB",
]
_DETAIL = [
    "out tok/s",
    "TTFT P95 ms",
    "E2E P50 ms",
    "E2E P99 ms",
    "E2E max ms",
    "E2E P95 from sched. ms",
    "ITL P99 ms",
    "ITL gaps timed / untimed",
]


def host_line(ctx: ReportContext) -> str | None:
    """The host's own load beside the figures (a CPU engine, or a load generator sharing the box):
    peak CPU, RAM in use and the engine process's resident memory, from the host sampler."""
    peak: dict[str, float] = {}
    for smp in ctx.samples:
        if smp.name in ("host.cpu_percent", "host.ram_used_bytes", "host.target_rss_bytes"):
            peak[smp.name] = max(peak.get(smp.name, smp.value), smp.value)
    if not peak:
        return None
    parts = []
    if "host.cpu_percent" in peak:
        parts.append(f"CPU max {peak['host.cpu_percent']:.0f} %")
    if "host.ram_used_bytes" in peak:
        parts.append(f"RAM in use max {fmt.gib(peak['host.ram_used_bytes'])} GiB")
    if "host.target_rss_bytes" in peak:
        parts.append(f"engine process RSS max {fmt.gib(peak['host.target_rss_bytes'])} GiB")
    return "Host (sampled): " + ", ".join(parts)


def tokens_caption(ctx: ReportContext) -> str:
    """Where output tokens were counted from stream chunks (no usage, no engine count), out tok/s is
    an estimate, and every table that shows it says so."""
    t = ctx.analysis.totals
    if not t.tokens_estimated:
        return ""
    return (
        f"; out tok/s is an estimate for {t.tokens_estimated:,} of {t.ok:,} requests (the server sent no "
        "token count: stream chunks counted, one token each)"
    )


def itl_sentence(r: RequestSummary) -> str | None:
    """How many inter-token gaps the ITL figures rest on, and how many could not be timed; None
    when the requests had no gaps at all."""
    untimed = r.itl_untimed
    if r.itl_timed + (untimed or 0) == 0:
        return None
    p99 = fmt.ms(r.itl.p99 if r.itl else None)
    line = f"ITL P99 {p99} ms over {r.itl_timed:,} timed gaps; "
    if untimed is None:
        return line + "how many could not be timed was not recorded"
    line += f"{untimed:,} ({fmt.pct(r.itl_untimed_share)}) read together with later bytes, not timed"
    if r.itl_few_timed:
        line += f" — over {ITL_UNTIMED_WARN:.0%}: the ITL tail rests on the gaps left"
    return line


def itl_gaps_cell(r: RequestSummary) -> str:
    """The table cell: timed / untimed (share); "–" for no gaps, "?" for an unrecorded untimed count."""
    untimed = r.itl_untimed
    if r.itl_timed + (untimed or 0) == 0:
        return "–"
    if untimed is None:
        return f"{r.itl_timed:,} / ?"
    return f"{r.itl_timed:,} / {untimed:,} ({fmt.pct(r.itl_untimed_share)})"


def _lag_mark(res: WindowResult) -> str:
    """A window whose latencies include the load generator's own lag (the runner's self-check), and
    one whose ITL rests on few gaps (more than ITL_UNTIMED_WARN of them could not be timed)."""
    mark = " (client lag)" if res.window.client_lag else ""
    if res.requests.itl_few_timed:
        mark += f" (ITL {fmt.pct(res.requests.itl_untimed_share)} untimed)"
    return mark


def _signal_row(res: WindowResult, delta: float | None) -> list[str]:
    r, worst = res.requests, res.resources.worst
    return [
        str(r.count),
        fmt.pct(r.error_rate),
        fmt.rate(r.throughput_rps),
        fmt.ms(r.e2e.p95 if r.e2e else None),
        fmt.delta_ms(delta),
        fmt.num(worst.get("engine.num_requests_waiting")),
        fmt.pct(worst.get("engine.kv_cache_usage_perc")),
        fmt.gib(worst.get("gpu.memory_used_bytes")),
    ]


def _detail_row(res: WindowResult) -> list[str]:
    r, e2e = res.requests, res.requests.e2e
    return [
        fmt.rate(r.output_tok_s),
        fmt.ms(r.ttft.p95 if r.ttft else None),
        fmt.ms(e2e.p50 if e2e else None),
        fmt.ms(e2e.p99 if e2e else None),
        fmt.ms(e2e.max if e2e else None),
        fmt.ms(r.e2e_sched.p95 if r.e2e_sched else None),
        fmt.ms(r.itl.p99 if r.itl else None),
        itl_gaps_cell(r),
    ]


def phases(ctx: ReportContext) -> list[Block]:
    a = ctx.analysis
    if not a.phases:
        return [Text("No requests were stored for this run.")]
    sig, det = [], []
    for comp in a.comparisons:
        for name, res in sorted(comp.phases.items(), key=lambda kv: (PHASE_ORDER.get(kv[0], 9), kv[0])):
            d = comp.deltas.get(name, {}).get("e2e_p95_ms")
            sig.append([str(comp.round), name + _lag_mark(res), *_signal_row(res, d.delta if d else None)])
            det.append([str(comp.round), name + _lag_mark(res), *_detail_row(res)])
    return [
        Text(
            "User layer (requests, errors, latency), service layer (queue, KV cache) and resource layer "
            "(GPU memory) side by side, one row per round and phase. Latencies are of successful requests."
        ),
        Table(["round", "phase", *_SIGNALS], sig, caption="Service and resource signals"),
        Table(["round", "phase", *_DETAIL], det, caption="Latency detail" + tokens_caption(ctx)),
    ]


def steps(ctx: ReportContext) -> list[Block]:
    a = ctx.analysis
    var = ctx.run.change.get("variable", "value")
    base = {c.round: c.phases.get("baseline") for c in a.comparisons}
    sig, det = [], []
    for s in a.steps:
        w = s.window
        b = base.get(w.round)
        mine = s.requests.e2e.p95 if s.requests.e2e else None
        ref = b.requests.e2e.p95 if b is not None and b.requests.e2e else None
        delta = None if mine is None or ref is None or w.phase == "baseline" else mine - ref
        head = [
            str(w.round),
            w.phase + _lag_mark(s),
            "–" if w.step is None else str(w.step),
            fmt.num(w.step_value),
        ]
        sig.append([*head, *_signal_row(s, delta)])
        det.append([*head, *_detail_row(s)])
    if not sig:
        return []
    return [
        Table(
            ["round", "phase", "step", var, *_SIGNALS], sig, caption="Service and resource signals per step"
        ),
        Table(
            ["round", "phase", "step", var, *_DETAIL],
            det,
            caption="Latency detail per step" + tokens_caption(ctx),
        ),
    ]
