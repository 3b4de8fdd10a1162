"""Estimate meets measurement: the memory composition per window, predicted beside measured.

Four figures per window (round x phase x step), each predicted by the capacity plan stored with
the run (`capacity_plan` event) and measured from the best source the run recorded, labelled:

- resident model: the start-up log's weights line (`startup_memory` event); else the device's
  reading before the first request, less the KV pool (that reading holds the runtime's own too);
- KV cache: the allocated pool in the bytes the engine printed (start-up log); where it shows only
  tokens (vLLM `cache_config_info`, SGLang `max_total_num_tokens`, a log without bytes) the figure is
  tokens, said so, set beside the plan's pool tokens; what is in use (usage fraction x pool, or the
  engine's token count x the bytes per token its own figures imply). Never the plan's constants: a
  measurement that borrows from the prediction cannot disagree with it;
- runtime overhead: what the peak reading holds beyond the weights and the KV pool;
- peak: the highest reading in the window: the target process's memory on the GPU where it is
  known, else the fullest GPU's; a CPU engine's process RSS, labelled host memory.

Predicted: the plan's components (overhead = every component but weights and KV cache; peak =
their sum, what the process holds at the profiled worst case), each with its band. Pure: reads
records only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vramlab.analysis.saturation import Saturation, StepSignals, request_shape, saturation
from vramlab.analysis.stats import Window
from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
from vramlab.records.capacity_plan import (
    CapacityEstimate,
    PlanFactsRecord,
    StartupObservation,
    capacity_plan_record,
    is_capacity_plan_note,
    startup_memory_record,
)
from vramlab.records.events import EventKind, fault_data
from vramlab.units import size

FIGURES = ("resident_model", "kv_cache", "runtime_overhead", "peak")
LABELS = {
    "resident_model": "resident model",
    "kv_cache": "KV cache (pool)",
    "runtime_overhead": "runtime overhead",
    "peak": "peak",
}
_OVERHEAD_PARTS = ("cuda_context", "nccl", "activation_peak", "non_torch", "cuda_graphs")
_DEVICE_SOURCES = ("gpu", "ledger")
# what the sim's ledger names an engine's process (a real driver names none): the target among co-tenants
ENGINE_PROCESSES = ("VLLM::EngineCore", "sglang::scheduler", "text-generation-server", "llama-server")


@dataclass(frozen=True)
class Figure:
    name: str
    predicted_bytes: int | None
    low_bytes: int | None
    high_bytes: int | None
    measured_bytes: int | None
    source: str  # where the measured value comes from ("" when not measured)
    host_memory: bool = False
    # the KV pool in tokens, beside its bytes: where the engine shows only tokens, the error is in tokens
    predicted_tokens: int | None = None
    measured_tokens: int | None = None

    @property
    def error_bytes(self) -> int | None:
        if self.predicted_bytes is None or self.measured_bytes is None:
            return None
        return self.predicted_bytes - self.measured_bytes

    @property
    def error_tokens(self) -> int | None:
        if self.predicted_tokens is None or self.measured_tokens is None:
            return None
        return self.predicted_tokens - self.measured_tokens

    @property
    def error_pct(self) -> float | None:
        """Predicted less measured over measured, in bytes; in tokens where only tokens were measured."""
        e = self.error_bytes
        if e is not None and self.measured_bytes:
            return 100.0 * e / self.measured_bytes
        t = self.error_tokens
        if self.measured_bytes is None and t is not None and self.measured_tokens:
            return 100.0 * t / self.measured_tokens
        return None

    @property
    def inside_band(self) -> bool | None:
        if self.measured_bytes is None or self.low_bytes is None or self.high_bytes is None:
            return None
        return self.low_bytes <= self.measured_bytes <= self.high_bytes


@dataclass(frozen=True)
class Row:
    round: int
    phase: str
    step: int | None
    step_value: float | None
    start_s: float
    end_s: float
    figures: tuple[Figure, ...]
    kv_used_bytes: int | None = None
    kv_used_tokens: int | None = None
    kv_used_source: str = ""
    kv_usage_max: float | None = None
    preempted: bool = False
    queued: bool = False
    activation_bytes: int = 0  # the plan's activation peak (part of the predicted overhead)

    def figure(self, name: str) -> Figure:
        return next(f for f in self.figures if f.name == name)

    def error_source(self) -> str:
        """Which component differs most from the plan, by how much (the peak's error, decomposed).
        Agreement is claimed only for what was measured, each within 1 % (a small model's MiB count too)."""
        if all(f.predicted_bytes is None for f in self.figures):
            return "no capacity plan to compare with"
        comps = [f for f in self.figures if f.name != "peak"]
        parts = [f for f in comps if f.error_bytes is not None]
        missing = [LABELS[f.name] for f in comps if f.error_bytes is None and f.error_tokens is None]
        tokens_only = [f for f in comps if f.error_bytes is None and f.error_tokens is not None]
        if not parts and not tokens_only:
            return "not measured" if self.figure("peak").measured_bytes is None else "components not measured"
        unmeasured = f" ({', '.join(missing)} not measured)" if missing else ""
        close = all(f.error_bytes == 0 or (f.error_pct is not None and abs(f.error_pct) <= 1) for f in parts)
        if close:
            far = [t for t in tokens_only if abs(t.error_pct or 0) > 1]
            if far:
                verb = "over-predicted" if (far[0].error_tokens or 0) > 0 else "under-predicted"
                return f"{LABELS[far[0].name]} {verb} by {abs(far[0].error_tokens or 0):,} tokens{unmeasured}"
            if missing or tokens_only:
                return "the measured components within 1 % of the plan" + unmeasured
            return "every component within 1 % of the plan"
        worst = max(parts, key=lambda f: abs(f.error_bytes or 0))
        err = worst.error_bytes or 0
        verb = "over-predicted" if err > 0 else "under-predicted"
        out = f"{LABELS[worst.name]} {verb} by {size(abs(err))} ({worst.error_pct or 0:+.1f} %)" + unmeasured
        if worst.name == "runtime_overhead" and 0 < err <= self.activation_bytes:
            out += (
                f", within the plan's activation peak ({size(self.activation_bytes)}, the profiled worst "
                "case): the workspace grows with the batch"
            )
        return out


@dataclass(frozen=True)
class Composition:
    plan: CapacityEstimate | None
    plan_facts: PlanFactsRecord | None
    startup: StartupObservation | None
    startup_source: str | None
    rows: list[Row]
    saturation: Saturation | None = None
    at_failure: list[tuple[float | None, Row]] = field(default_factory=list)  # drill: (failing value, row)
    notes: list[str] = field(default_factory=list)
    rest_bytes: int | None = (
        None  # the device at rest: the last reading before the first request (else the lowest)
    )

    @property
    def measured(self) -> bool:
        return any(f.measured_bytes is not None for r in self.rows for f in r.figures)


# --- reading the stored run ------------------------------------------------------------------


class _Readings:
    """The run's samples by name, and the device series the peak is read from."""

    def __init__(self, samples: Sequence[SampleRecord], pid: int | None) -> None:
        self.by_name: dict[str, list[SampleRecord]] = {}
        for s in samples:
            self.by_name.setdefault(s.name, []).append(s)
        procs = [s for s in self.by_name.get("gpu.process_memory_bytes", ()) if s.source in _DEVICE_SOURCES]
        mine = [s for s in procs if pid is not None and s.labels.get("pid") == str(pid)]
        named = [s for s in procs if pid is None and s.labels.get("process") in ENGINE_PROCESSES]
        if mine:
            self.device = [(s.t_s, s.value) for s in mine]
            self.device_source = f"{mine[0].source}: the target process (pid {pid}) on its GPU"
            self.host = False
        elif named:  # the engine by its process name (after a restart: each of its pids in turn)
            self.device = [(s.t_s, s.value) for s in named]
            self.device_source = (
                f"{named[0].source}: the engine's process ({named[0].labels['process']}) on its GPU"
            )
            self.host = False
        elif self.by_name.get("gpu.memory_used_bytes"):
            used = [s for s in self.by_name["gpu.memory_used_bytes"] if s.source in _DEVICE_SOURCES]
            self.device = [(s.t_s, s.value) for s in used]
            src = used[0].source if used else "gpu"
            self.device_source = f"{src}: memory used on the fullest GPU"
            self.host = False
        else:
            rss = self.by_name.get("host.target_rss_bytes", [])
            self.device = [(s.t_s, s.value) for s in rss]
            self.device_source = "host memory: the target process's RSS (a CPU engine)"
            self.host = True

    def window(self, name: str, start: float, end: float) -> list[float]:
        return [s.value for s in self.by_name.get(name, ()) if start <= s.t_s <= end]

    def peak(self, start: float, end: float) -> float | None:
        vals = [v for t, v in self.device if start <= t <= end]
        return max(vals) if vals else None

    def first(self, name: str) -> float | None:
        vals = self.by_name.get(name)
        return vals[-1].value if vals else None


def _last_event(events: Sequence[EventRecord], kind: EventKind) -> EventRecord | None:
    found = [e for e in events if e.kind == kind]
    return found[-1] if found else None


# A CPU engine's runtime terms (capacity/engines/vllm_cpu.py, llamacpp_cpu.py, transformers on the host)
HOST_RUNTIME_PARTS = ("runtime", "api_server")


def _predicted(
    plan: CapacityEstimate | None, runtime_resident: bool = False
) -> dict[str, tuple[int, int, int]]:
    """The plan's figures; *runtime_resident*: the measured resident model is a host reading after load, which
    holds the process's runtime too, so the predicted one is the weights and the runtime terms."""
    if not plan:
        return {}
    comps = {c.name: c for c in plan.components}

    def trio(names: Sequence[str]) -> tuple[int, int, int]:
        cs = [comps[n] for n in names if n in comps]
        return (
            sum(c.bytes for c in cs),
            sum(c.low_bytes for c in cs),
            sum(c.high_bytes for c in cs),
        )

    resident = ("weights", *HOST_RUNTIME_PARTS) if runtime_resident else ("weights",)
    out = {
        "resident_model": trio(resident),
        "kv_cache": trio(["kv_cache"]),
        "runtime_overhead": trio([n for n in comps if n not in (*resident, "kv_cache")]),
    }
    total = trio(list(comps))
    out["peak"] = total  # a high end beyond the card is the plan saying the peak may not fit
    out["activation"] = trio(["activation_peak"])
    return out


@dataclass(frozen=True)
class _Pool:
    bytes: int | None
    tokens: int | None
    source: str


def _pool(startup: StartupObservation | None, reads: _Readings) -> _Pool:
    """The pool in the engine's own figures: the bytes it printed, its tokens (log or metrics)."""
    tokens: int | None = None
    t_src = ""
    if startup and startup.kv_cache_tokens:
        tokens, t_src = startup.kv_cache_tokens, "start-up log"
    blocks, block = reads.first("engine.kv_cache_blocks"), reads.first("engine.kv_block_size")
    if tokens is None and blocks and block:
        tokens = int(blocks * block)
        t_src = f"engine metric cache_config_info: {int(blocks):,} blocks x {int(block)} tokens"
    if tokens is None and reads.first("engine.kv_cache_pool_tokens"):
        tokens, t_src = (
            int(reads.first("engine.kv_cache_pool_tokens") or 0),
            "engine metric max_total_num_tokens",
        )
    if startup and startup.kv_cache_bytes:
        b = startup.kv_cache_bytes
        of = f" ({tokens:,} tokens)" if tokens else ""
        return _Pool(b, tokens, f"start-up log: the KV cache size it printed{of}")
    engine_bpt = startup.extra_number("kv_bytes_per_token") if startup else None
    if tokens and engine_bpt:  # the bytes a token takes as the engine's own figures put them
        return _Pool(
            int(tokens * engine_bpt),
            tokens,
            f"{t_src}: {tokens:,} tokens x {engine_bpt:,.0f} B/token (the engine's own)",
        )
    if tokens:
        return _Pool(None, tokens, f"{t_src}: {tokens:,} tokens (no bytes shown by the engine: tokens only)")
    return _Pool(None, None, "")


def _resident(
    startup: StartupObservation | None, reads: _Readings, pool: _Pool, first_request_s: float | None
) -> tuple[int | None, str]:
    if startup and startup.weights_bytes:
        return startup.weights_bytes, "start-up log: the weights it loaded"
    host = startup.extra_number("host_weights_bytes") if startup else None
    if host:  # a CPU engine (llama.cpp without offload): its model buffer is in host memory
        return int(host), "start-up log: the model buffer it printed (host memory)"
    if first_request_s is None:
        return None, ""
    before = [v for t, v in reads.device if t < first_request_s]
    if not before:
        return None, ""
    less = pool.bytes or 0
    label = reads.device_source.split(":")[0]
    return int(before[-1] - less), (
        f"{label}: in use after load, before the first request"
        + (", less the KV pool" if less else "")
        + " (holds the runtime's own memory too)"
    )


def _kv_in_use(tokens: list[float], usage: list[float], pool: _Pool) -> tuple[int | None, int | None, str]:
    """(bytes, tokens, source) of the KV cache in use at its highest in the window."""
    if tokens:
        used_t = int(max(tokens))
        # the bytes a token takes as the engine's own figures put it (its pool's bytes over its tokens)
        used_b = int(used_t * pool.bytes / pool.tokens) if pool.bytes and pool.tokens else None
        return (
            used_b,
            used_t,
            "engine metric kv_cache_tokens"
            + (" x the bytes per token of the engine's pool" if used_b is not None else " (tokens only)"),
        )
    if usage and (pool.bytes or pool.tokens):
        u = max(usage)
        used_b = int(u * pool.bytes) if pool.bytes else None
        return (
            used_b,
            int(u * pool.tokens) if pool.tokens else None,
            "engine metric KV usage fraction x the pool",
        )
    return None, None, ""


def _row(
    w: Window,
    pred: dict[str, tuple[int, int, int]],
    reads: _Readings,
    pool: _Pool,
    resident: tuple[int | None, str],
    plan_tokens: int | None,
    end_s: float | None = None,
) -> Row:
    start, end = w.start_s, (end_s if end_s is not None else (w.samples_end_s or w.end_s))
    peak = reads.peak(start, end)
    peak_src = reads.device_source
    if peak is None and end_s is not None:
        # a step that failed before its first sample: the card as last read before the failure
        before = [v for t, v in reads.device if t <= end]
        if before:
            peak, peak_src = before[-1], f"{reads.device_source} (the last reading before the failure)"
    weights, w_src = resident
    overhead = None
    if peak is not None and weights is not None and pool.bytes is not None:
        overhead = int(peak) - weights - pool.bytes
    measured = {
        "resident_model": (weights, w_src),
        "kv_cache": (pool.bytes, pool.source),
        "runtime_overhead": (
            overhead,
            "peak reading less the resident model and the KV pool"
            if overhead is not None
            else (
                "needs the KV pool in bytes: the engine showed tokens only" if pool.tokens and peak else ""
            ),
        ),
        "peak": (None if peak is None else int(peak), peak_src if peak is not None else ""),
    }
    figs = []
    for name in FIGURES:
        p = pred.get(name)
        m, src = measured[name]
        figs.append(
            Figure(
                name,
                p[0] if p else None,
                p[1] if p else None,
                p[2] if p else None,
                m,
                src,
                reads.host and name in ("peak", "runtime_overhead") and m is not None,
                plan_tokens if name == "kv_cache" else None,
                pool.tokens if name == "kv_cache" else None,
            )
        )
    usage = reads.window("engine.kv_cache_usage_perc", start, end)
    used_b, used_t, used_src = _kv_in_use(reads.window("engine.kv_cache_tokens", start, end), usage, pool)
    pre = reads.window("engine.num_preemptions_total", start, end)
    waiting = reads.window("engine.num_requests_waiting", start, end)
    return Row(
        w.round,
        w.phase,
        w.step,
        w.step_value,
        start,
        end,
        tuple(figs),
        used_b,
        used_t,
        used_src,
        max(usage) if usage else None,
        bool(pre) and max(pre) > min(pre),
        # queued for most of the window: an engine shows a request waiting for a moment even when idle
        bool(waiting) and sum(1 for x in waiting if x > 0) * 2 >= len(waiting),
        pred.get("activation", (0,))[0],
    )


def _saturation_of(
    run: RunRecord,
    plan: CapacityEstimate | None,
    pool_tokens: int | None,
    rows: list[Row],
    reqs: Sequence[RequestRecord],
) -> Saturation | None:
    variable = (run.change or {}).get("variable")
    if not variable:
        return None
    doc = run.plan if isinstance(run.plan, dict) else {}
    steps = [
        StepSignals(r.round, r.step, float(r.step_value), r.kv_usage_max, r.preempted, r.queued)
        for r in rows
        if r.phase in ("treatment", "ramp") and r.step_value is not None
    ]
    return saturation(variable, plan, pool_tokens, request_shape(doc, reqs), steps, reqs)


def compose(
    run: RunRecord,
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
    windows: Sequence[Window],
    first_request_s: float | None,
    requests: Sequence[RequestRecord] = (),
) -> Composition:
    """Predicted beside measured for every window of a stored run (windows: analysis Window objects;
    *requests*: the run's, for the steps' own request sizes and refusals in the saturation point)."""
    plan_ev, start_ev = (
        _last_event(events, EventKind.CAPACITY_PLAN),
        _last_event(events, EventKind.STARTUP_MEMORY),
    )
    stored_plan = capacity_plan_record(plan_ev) if plan_ev else None
    stored_startup = startup_memory_record(start_ev) if start_ev else None
    plan = stored_plan.estimate if stored_plan is not None else None
    startup = stored_startup.observation if stored_startup is not None else None
    src = stored_startup.source if stored_startup is not None else None
    pid = (run.plan.get("target") or {}).get("pid") if isinstance(run.plan, dict) else None
    reads = _Readings(samples, pid)
    plan_tokens = plan.kv_cache_tokens if plan and plan.kv_cache_tokens else None
    pool = _pool(startup, reads)
    resident = _resident(startup, reads, pool, first_request_s)
    pred = _predicted(plan, reads.host and resident[1].startswith("host memory"))
    rows = [_row(w, pred, reads, pool, resident, plan_tokens) for w in windows]
    notes = [e.message for e in events if is_capacity_plan_note(e)]
    at_failure = []
    by_step = {(w.round, w.step): w for w in windows if w.phase == "ramp"}
    for e in events:
        if e.kind == EventKind.FAULT and e.round is not None:
            fault = fault_data(e)
            w = by_step.get((e.round, fault.get("step")))
            if w is not None:
                t0 = fault.get("t0_s")
                at_failure.append(
                    (
                        fault.get("value"),
                        _row(
                            w,
                            pred,
                            reads,
                            pool,
                            resident,
                            plan_tokens,
                            end_s=float(t0) if t0 is not None else e.t_s,
                        ),
                    )
                )
    sat = _saturation_of(run, plan, pool.tokens or plan_tokens, rows, requests)
    before = [v for t, v in reads.device if first_request_s is not None and t < first_request_s]
    rest = before[-1] if before else (min(v for _, v in reads.device) if reads.device else None)
    return Composition(
        plan,
        stored_plan.facts if stored_plan is not None else None,
        startup,
        src,
        rows,
        sat,
        at_failure,
        notes,
        None if rest is None else int(rest),
    )
