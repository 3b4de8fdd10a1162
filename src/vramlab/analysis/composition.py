"""Estimate meets measurement: the memory composition per window, predicted beside measured.

Four figures per window (round x phase x step), each predicted by the capacity plan stored with
the run (`capacity_plan` event) and measured from the best source the run recorded, labelled:

- resident model: the start-up log's weights line (`startup_memory` event); else the device's
  reading before the first request, less the KV pool (that reading holds the runtime's own too);
- KV cache: the allocated pool (start-up log; vLLM `cache_config_info`; SGLang
  `max_total_num_tokens`), with what is in use (usage fraction x pool, or the engine's token count);
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
from typing import Any

from vramlab.records import EventRecord, SampleRecord
from vramlab.records.events import EventKind, capacity_plan_data, fault_data, startup_memory_data
from vramlab.units import GIB, gib

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
_SATURATED = 0.98  # the pool is full to within a block or two per sequence (vLLM tops out near 99 %)


@dataclass(frozen=True)
class Figure:
    name: str
    predicted_bytes: int | None
    low_bytes: int | None
    high_bytes: int | None
    measured_bytes: int | None
    source: str  # where the measured value comes from ("" when not measured)
    host_memory: bool = False

    @property
    def error_bytes(self) -> int | None:
        if self.predicted_bytes is None or self.measured_bytes is None:
            return None
        return self.predicted_bytes - self.measured_bytes

    @property
    def error_pct(self) -> float | None:
        e = self.error_bytes
        return None if e is None or not self.measured_bytes else 100.0 * e / self.measured_bytes

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
        """Which component differs most from the plan, by how much (the peak's error, decomposed)."""
        parts = [
            (f.name, f.error_bytes) for f in self.figures if f.name != "peak" and f.error_bytes is not None
        ]
        if not parts:
            return "not measured" if self.figure("peak").measured_bytes is None else "components not measured"
        name, err = max(parts, key=lambda p: abs(p[1] or 0))
        assert err is not None
        if abs(err) < GIB / 100:
            return "every component within 0.01 GiB of the plan"
        verb = "over-predicted" if err > 0 else "under-predicted"
        out = f"{LABELS[name]} {verb} by {gib(abs(err), unit=True)}"
        if name == "runtime_overhead" and 0 < err <= self.activation_bytes:
            out += (
                f", within the plan's activation peak ({gib(self.activation_bytes, unit=True)}, the profiled worst "
                "case): the workspace grows with the batch"
            )
        return out


@dataclass(frozen=True)
class Saturation:
    variable: str
    predicted_value: float | None  # the variable's value at which the KV pool is full
    predicted_basis: str
    # (step value, round) where each signal first showed, lowest value first; None: not in this run
    kv_full: tuple[float, int] | None  # KV usage >= 98 %
    preemption: tuple[float, int] | None  # the engine's preemption counter rose
    queueing: tuple[float, int] | None  # requests waiting for most of the window

    @property
    def observed_value(self) -> float | None:
        """The first value where the pool was full or the engine preempted (queueing alone can be the
        batch limit, not the KV pool)."""
        hits = [h[0] for h in (self.kv_full, self.preemption) if h is not None]
        return min(hits) if hits else None


@dataclass(frozen=True)
class Composition:
    plan: dict[str, Any] | None
    plan_facts: dict[str, Any] | None
    startup: dict[str, Any] | None
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
    plan: dict[str, Any] | None, runtime_resident: bool = False
) -> dict[str, tuple[int, int, int]]:
    """The plan's figures; *runtime_resident*: the measured resident model is a host reading after load, which
    holds the process's runtime too, so the predicted one is the weights and the runtime terms."""
    if not plan:
        return {}
    comps = {c["name"]: c for c in plan.get("components", ())}

    def trio(names: Sequence[str]) -> tuple[int, int, int]:
        cs = [comps[n] for n in names if n in comps]
        return (
            sum(int(c["bytes"]) for c in cs),
            sum(int(c.get("low_bytes", c["bytes"])) for c in cs),
            sum(int(c.get("high_bytes", c["bytes"])) for c in cs),
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


def _pool(startup: dict[str, Any] | None, reads: _Readings, bpt: int | None) -> _Pool:
    engine_bpt = ((startup or {}).get("extra") or {}).get("kv_bytes_per_token")
    if startup and startup.get("kv_cache_tokens") and engine_bpt:  # vLLM's CPU build: its own block bytes
        t = int(startup["kv_cache_tokens"])
        return _Pool(
            int(t * engine_bpt),
            t,
            f"start-up log: {t:,} tokens x {engine_bpt:,.0f} B/token (the engine's own)",
        )
    if startup and startup.get("kv_cache_tokens") and bpt:
        t = int(startup["kv_cache_tokens"])
        return _Pool(t * bpt, t, f"start-up log: {t:,} tokens x {bpt:,} B/token (the plan's per-token size)")
    if startup and startup.get("kv_cache_bytes"):
        b = int(startup["kv_cache_bytes"])
        printed = startup.get("kv_cache_tokens")
        return _Pool(
            b,
            int(printed) if printed else (b // bpt if bpt else None),
            "start-up log: the KV cache size it printed",
        )
    blocks, size = reads.first("engine.kv_cache_blocks"), reads.first("engine.kv_block_size")
    if blocks and size:
        t = int(blocks * size)
        return _Pool(
            t * bpt if bpt else None,
            t,
            f"engine metric cache_config_info: {int(blocks):,} blocks x "
            f"{int(size)} tokens" + (" x the plan's bytes per token" if bpt else ""),
        )
    pool_t = reads.first("engine.kv_cache_pool_tokens")
    if pool_t:
        t = int(pool_t)
        return _Pool(
            t * bpt if bpt else None,
            t,
            "engine metric max_total_num_tokens" + (" x the plan's bytes per token" if bpt else ""),
        )
    return _Pool(None, None, "")


def _resident(
    startup: dict[str, Any] | None, reads: _Readings, pool: _Pool, first_request_s: float | None
) -> tuple[int | None, str]:
    if startup and startup.get("weights_bytes"):
        return int(startup["weights_bytes"]), "start-up log: the weights it loaded"
    host = (startup or {}).get("extra", {}).get("host_weights_bytes")
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


def _row(
    w: Any,
    pred: dict[str, tuple[int, int, int]],
    reads: _Readings,
    pool: _Pool,
    resident: tuple[int | None, str],
    bpt: int | None,
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
            "peak reading less the resident model and the KV pool" if overhead is not None else "",
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
            )
        )
    usage = reads.window("engine.kv_cache_usage_perc", start, end)
    tokens = reads.window("engine.kv_cache_tokens", start, end)
    used_b = used_t = None
    used_src = ""
    if tokens:
        used_t = int(max(tokens))
        used_b = used_t * bpt if bpt else None
        used_src = "engine metric kv_cache_tokens" + (" x the plan's bytes per token" if bpt else "")
    elif usage and (pool.bytes or pool.tokens):
        u = max(usage)
        used_b = int(u * pool.bytes) if pool.bytes else None
        used_t = int(u * pool.tokens) if pool.tokens else None
        used_src = "engine metric KV usage fraction x the pool"
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


def _saturation(
    run_plan: dict[str, Any],
    change: dict[str, Any],
    plan: dict[str, Any] | None,
    pool: _Pool,
    rows: list[Row],
) -> Saturation | None:
    var = change.get("variable")
    if not var:
        return None
    pool_t = pool.tokens or (plan or {}).get("kv_cache_tokens")
    prompt, output, users = _request_shape(run_plan)
    pred, basis = None, "no KV pool known"
    if pool_t and prompt is not None and output is not None:
        block = int((plan or {}).get("block_size") or 1)
        per_req = -(-(prompt + output) // block) * block
        if var in ("concurrency", "batch"):
            pred = float(pool_t // per_req)
            basis = f"{int(pool_t):,} pool tokens / {per_req:,} tokens a request"
            seqs = ((plan or {}).get("settings") or {}).get("max_num_seqs")
            if seqs and seqs < pred:
                basis += f"; max_num_seqs {seqs} binds first: beyond it requests queue with the pool not full"
        elif var in ("prompt_tokens", "context"):
            pred = float(pool_t // max(1, users) - output)
            basis = (
                f"{int(pool_t):,} pool tokens / {users} concurrent request(s), less {output} output tokens"
            )
        else:
            basis = f"{var} does not fill the KV pool by itself"
    first: dict[str, tuple[float, int] | None] = {"kv_full": None, "preemption": None, "queueing": None}
    for r in sorted(
        (r for r in rows if r.phase in ("treatment", "ramp") and r.step_value is not None),
        key=lambda r: (r.step_value, r.round),
    ):
        seen = {
            "kv_full": r.kv_usage_max is not None and r.kv_usage_max >= _SATURATED,
            "preemption": r.preempted,
            "queueing": r.queued,
        }
        for k, hit in seen.items():
            if hit and first[k] is None:
                first[k] = (float(r.step_value or 0), r.round)
    return Saturation(var, pred, basis, *(first[k] for k in ("kv_full", "preemption", "queueing")))


def _request_shape(plan: dict[str, Any]) -> tuple[int | None, int | None, int]:
    """(prompt tokens, output tokens, concurrent users) of the run's requests, from its plan document."""
    syn = ((plan.get("fixed") or {}).get("input") or {}).get("synthetic")
    if syn:
        return (
            int(syn["prompt_tokens"]),
            int(syn["output_tokens"]),
            int((plan.get("load") or {}).get("concurrency", 1)),
        )
    load = plan.get("load") or {}
    if "prompt_tokens" in load:  # a drill's load
        return int(load["prompt_tokens"]), int(load.get("max_tokens", 0)), int(load.get("concurrency", 1))
    return None, None, 1


def compose(
    run: Any,
    samples: Sequence[SampleRecord],
    events: Sequence[EventRecord],
    windows: Sequence[Any],
    first_request_s: float | None,
) -> Composition:
    """Predicted beside measured for every window of a stored run (windows: analysis Window objects)."""
    plan_ev, start_ev = (
        _last_event(events, EventKind.CAPACITY_PLAN),
        _last_event(events, EventKind.STARTUP_MEMORY),
    )
    plan_data = capacity_plan_data(plan_ev) if plan_ev else None
    start_data = startup_memory_data(start_ev) if start_ev else None
    plan = plan_data.get("estimate") if plan_data is not None else None
    startup = start_data.get("observation") if start_data is not None else None
    src = start_data.get("source") if start_data is not None else None
    pid = (run.plan.get("target") or {}).get("pid") if isinstance(run.plan, dict) else None
    reads = _Readings(samples, pid)
    bpt = int(plan["kv_bytes_per_token"]) if plan and plan.get("kv_bytes_per_token") else None
    pool = _pool(startup, reads, bpt)
    resident = _resident(startup, reads, pool, first_request_s)
    pred = _predicted(plan, reads.host and resident[1].startswith("host memory"))
    rows = [_row(w, pred, reads, pool, resident, bpt) for w in windows]
    notes = [
        e.message
        for e in events
        if e.kind in (EventKind.NOTE, EventKind.WARNING) and e.message.startswith("capacity plan:")
    ]
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
                            w, pred, reads, pool, resident, bpt, end_s=float(t0) if t0 is not None else e.t_s
                        ),
                    )
                )
    sat = _saturation(run.plan if isinstance(run.plan, dict) else {}, run.change or {}, plan, pool, rows)
    before = [v for t, v in reads.device if first_request_s is not None and t < first_request_s]
    rest = before[-1] if before else (min(v for _, v in reads.device) if reads.device else None)
    return Composition(
        plan,
        plan_data.get("facts") if plan_data is not None else None,
        startup,
        src,
        rows,
        sat,
        at_failure,
        notes,
        None if rest is None else int(rest),
    )
