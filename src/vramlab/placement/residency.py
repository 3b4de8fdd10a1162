"""Residency: which instances stay loaded, and a trace-driven simulation of loads and evictions.

The simulation is a deterministic discrete-event loop over a request trace. Resident instances
are loaded before the trace starts and never leave. On-demand instances load on their first
request, serve, and are unloaded or put to sleep by the eviction policy:

- `lru`: when a load needs room, unload idle instances, least recently used first.
- `priority`: the same, lowest priority first, and never an instance of higher priority than the
  one that needs the room (that request waits instead).
- `keep-alive`: Ollama-like; an idle instance is unloaded `keep_alive_s` after its last request
  (0 = at once, -1 = never), and LRU under pressure.
- `sleep-1` / `sleep-2`: vLLM sleep mode. Under pressure an idle engine sleeps instead of exiting:
  level 1 offloads weights to CPU RAM and drops the KV cache (wake = weights over PCIe), level 2
  drops both (wake = reload from the weight source, without restarting the engine). The process,
  and its CUDA context, stays on the card.

Loads on one card run one at a time: engines started together miscount each other's memory
(vLLM #55827), so the simulated operator starts them in sequence, as `settings` advises.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from vramlab.errors import ConfigError
from vramlab.placement.inputs import Fleet, Instance, Policy
from vramlab.placement.pack import PackResult
from vramlab.records.stats import percentile

# Service-time defaults when the models file gives none: decode streams the weights once per
# step at this share of HBM bandwidth; prefill runs at this share of bf16 peak, counting
# ~2 FLOP per parameter per token, which is ~1 FLOP per weight byte at 16-bit.
DECODE_BANDWIDTH_EFFICIENCY = 0.7
PREFILL_FLOPS_EFFICIENCY = 0.4


@dataclass(frozen=True)
class Request:
    t_s: float
    model: str
    prompt_tokens: int = 0
    output_tokens: int = 0


def load_trace(path: str | Path) -> list[Request]:
    """JSON lines `{"t_s": .., "model": .., "prompt_tokens": .., "output_tokens": ..}`, sorted by time."""
    from vramlab.infile import DATA_BYTES, read_text

    path = Path(path)
    text = read_text(path, "trace", DATA_BYTES, expect="expected JSON lines of requests")
    out: list[Request] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            t = float(row["t_s"])
            if not math.isfinite(t) or t < 0:
                raise ValueError(f"t_s must be a finite time >= 0, got {row['t_s']!r}")
            model = row["model"]
            if not isinstance(model, str) or not model:
                raise ValueError("model must be a non-empty string")
            p, o = int(row.get("prompt_tokens", 0)), int(row.get("output_tokens", 0))
            if p < 0 or o < 0:
                raise ValueError("token counts must be >= 0")
        except KeyError as exc:
            raise ConfigError(f"{path}:{n}: missing field {exc.args[0]!r}") from None
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{path}:{n}: {exc}") from None
        out.append(Request(t, model, p, o))
    if not out:
        raise ConfigError(f"{path}: no requests in the trace")
    return sorted(out, key=lambda r: r.t_s)  # stable: equal times keep file order


# --- residency decision --------------------------------------------------------------------------
def cold_load_s(inst: Instance, weights_bytes_total: int) -> float:
    return weights_bytes_total / (inst.load_gbps * 1e9) + inst.engine_start_s


def decide(
    inst: Instance, weights_bytes_total: int, policy: Policy, rate_rps: float | None = None
) -> tuple[str, str]:
    """'resident' or 'on-demand', and why, from traffic, the SLO and the cost of a load."""
    if inst.residency != "auto":
        return inst.residency, "set in the models file"
    load_s = cold_load_s(inst, weights_bytes_total)
    if inst.slo_ms is not None and load_s * 1000 > inst.slo_ms:
        return "resident", f"a cold start ({load_s:.1f} s) would break its {inst.slo_ms:g} ms SLO"
    rate = inst.rate_rps if inst.rate_rps is not None else rate_rps
    if rate is None:
        return "resident", "no traffic rate given"
    window = policy.keep_alive_s if policy.keep_alive_s > 0 else 10 * load_s
    if rate * window >= 1:
        return "resident", f"{rate:g} req/s is busy enough to stay loaded (>= 1 request per {window:g} s)"
    return "on-demand", (f"{rate:g} req/s leaves it idle most of the time; a load costs {load_s:.1f} s")


# --- simulation ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimModel:
    name: str
    priority: int
    cards: tuple[int, ...]
    loaded_bytes: int  # per GPU while loaded
    asleep_bytes: int  # per GPU while asleep
    resident: bool
    cold_load_s: float
    wake1_s: float
    wake2_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float

    def service_s(self, r: Request) -> float:
        return r.prompt_tokens / self.prefill_tokens_per_s + r.output_tokens / self.decode_tokens_per_s


def sim_models(result: PackResult, instances: tuple[Instance, ...] | list[Instance]) -> list[SimModel]:
    from vramlab.capacity.gpus import get_gpu

    out = []
    by_name = {i.name: i for i in instances}
    for p in result.placements:
        inst, d = by_name[p.instance], p.demand
        card = result.fleet.cards[p.cards[0]]
        gpu = get_gpu(card.gpu_name)
        w = max(d.weights_bytes, 1)
        decode = inst.decode_tokens_per_s or gpu.bandwidth_gbps * 1e9 * DECODE_BANDWIDTH_EFFICIENCY / w
        prefill = inst.prefill_tokens_per_s or gpu.bf16_tflops * 1e12 * PREFILL_FLOPS_EFFICIENCY / w
        out.append(
            SimModel(
                p.instance,
                inst.priority,
                p.cards,
                d.total_bytes,
                d.asleep_bytes,
                p.residency == "resident",
                cold_load_s(inst, d.weights_bytes * p.tp),
                d.weights_bytes / (card.pcie_gbps * 1e9),  # each GPU copies its own shard back
                d.weights_bytes * p.tp / (inst.load_gbps * 1e9),
                prefill,
                decode,
            )
        )
    return out


@dataclass
class _Engine:
    m: SimModel
    state: str = "off"  # off | loading | ready | asleep
    sleep_level: int = 0
    inflight: int = 0
    last_used_s: float = -1.0
    idle_token: int = 0
    waiters: list[tuple[int, float]] = field(default_factory=list)  # (request index, arrival)
    blocked: bool = False


@dataclass(frozen=True)
class ModelStats:
    model: str
    priority: int
    resident: bool
    requests: int
    cold_starts: int
    wakes: int
    delayed: int
    evictions: int
    expiries: int
    added_p50_ms: float
    added_p95_ms: float
    added_p99_ms: float
    added_max_ms: float


@dataclass(frozen=True)
class PriorityStats:
    priority: int
    requests: int
    delayed: int
    wait_p95_ms: float
    wait_max_ms: float
    wait_total_s: float


@dataclass(frozen=True)
class SimReport:
    policy: str
    keep_alive_s: float
    requests: int
    unknown_model_requests: int
    cold_starts: int
    evictions: int
    models: tuple[ModelStats, ...]
    priorities: tuple[PriorityStats, ...]  # highest priority first
    end_s: float


def _percentile_or_zero(values: list[float], q: float) -> float:
    """The shared percentile (vramlab.records.stats, linear interpolation); 0 with no values."""
    return percentile(values, q) if values else 0.0


class _Sim:
    def __init__(self, models: list[SimModel], fleet: Fleet, policy: Policy) -> None:
        self.fleet, self.policy = fleet, policy
        self.eng = {m.name: _Engine(m) for m in models}
        self.used = [0] * len(fleet.cards)
        self.loader_free_s = [0.0] * len(fleet.cards)
        self.events: list[tuple[float, int, str, str, int]] = []
        self.seq = 0
        self.counts: dict[str, dict[str, int]] = {
            m.name: dict.fromkeys(("cold", "wake", "evict", "expire"), 0) for m in models
        }
        self.added: dict[int, float] = {}
        self.blocked: list[tuple[int, float, str]] = []  # (-priority, arrival, model)
        for e in self.eng.values():
            if e.m.resident:
                e.state = "ready"
                self._hold(e, e.m.loaded_bytes)

    def push(self, t: float, kind: str, model: str, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, model, arg))

    def _hold(self, e: _Engine, nbytes: int) -> None:
        for c in e.m.cards:
            self.used[c] += nbytes

    def held(self, e: _Engine) -> int:
        return {"off": 0, "asleep": e.m.asleep_bytes}.get(e.state, e.m.loaded_bytes)

    def free(self, c: int) -> int:
        return self.fleet.cards[c].memory_bytes - self.used[c]

    # -- admission and eviction ------------------------------------------------------------------
    def _victims(self, e: _Engine) -> list[tuple[_Engine, str]]:
        """Engines that may give room to *e*, in eviction order, with what they would do."""
        shared = [
            v
            for v in self.eng.values()
            if v is not e
            and not v.m.resident
            and set(v.m.cards) & set(e.m.cards)
            and v.inflight == 0
            and v.state in ("ready", "asleep")
        ]
        pol = self.policy.eviction
        if pol == "priority":
            shared = [v for v in shared if v.m.priority <= e.m.priority]
            shared.sort(key=lambda v: (v.m.priority, v.last_used_s, v.m.name))
        else:
            shared.sort(key=lambda v: (v.last_used_s, v.m.name))
        if pol in ("sleep-1", "sleep-2"):
            level = 1 if pol == "sleep-1" else 2
            ready = [(v, f"sleep{level}") for v in shared if v.state == "ready"]
            return ready + [(v, "off") for v in shared]  # then stop sleeping engines, LRU
        return [(v, "off") for v in shared if v.state == "ready"] + [
            (v, "off") for v in shared if v.state == "asleep"
        ]

    def try_admit(self, e: _Engine, t: float) -> bool:
        """Start loading *e* if the policy can make room on all its cards; else leave things be."""
        need = e.m.loaded_bytes - self.held(e)
        short = {c: need - self.free(c) for c in e.m.cards if need > self.free(c)}
        plan: list[tuple[_Engine, str]] = []
        if short:
            after: dict[str, str] = {}  # an engine's state once the plan so far has run
            gain = dict.fromkeys(short, 0)
            for v, action in self._victims(e):
                cur = after.get(v.m.name, v.state)
                if action.startswith("sleep"):
                    if cur != "ready":
                        continue
                    freed, after[v.m.name] = v.m.loaded_bytes - v.m.asleep_bytes, "asleep"
                else:
                    if cur == "off":
                        continue
                    freed = v.m.loaded_bytes if cur == "ready" else v.m.asleep_bytes
                    after[v.m.name] = "off"
                if freed <= 0 or not set(v.m.cards) & set(short):
                    continue
                plan.append((v, action))
                for c in v.m.cards:
                    if c in gain:
                        gain[c] += freed
                if all(gain[c] >= short[c] for c in short):
                    break
            else:
                return False  # not enough even with every eligible engine out: wait, evict nothing
        for v, action in plan:
            self._evict(v, action)
        self._start_load(e, t)
        return True

    def _evict(self, v: _Engine, action: str, expiry: bool = False) -> None:
        if v.state == "ready":
            self.counts[v.m.name]["expire" if expiry else "evict"] += 1
        self._hold(v, -self.held(v))
        if action == "off":
            v.state, v.sleep_level = "off", 0
        else:
            v.state, v.sleep_level = "asleep", int(action[-1])
            self._hold(v, v.m.asleep_bytes)
        v.idle_token += 1  # cancels a pending keep-alive expiry

    def _start_load(self, e: _Engine, t: float) -> None:
        if e.state == "asleep":
            load_s = e.m.wake1_s if e.sleep_level == 1 else e.m.wake2_s
            self.counts[e.m.name]["wake"] += 1
        else:
            load_s = e.m.cold_load_s
            self.counts[e.m.name]["cold"] += 1
        self._hold(e, e.m.loaded_bytes - self.held(e))
        start = max([t] + [self.loader_free_s[c] for c in e.m.cards])
        ready = start + load_s
        for c in e.m.cards:
            self.loader_free_s[c] = ready
        e.state, e.blocked = "loading", False
        self.push(ready, "ready", e.m.name)

    # -- requests --------------------------------------------------------------------------------
    def serve(self, e: _Engine, idx: int, arrival: float, t: float, r: Request) -> None:
        self.added[idx] = t - arrival
        e.inflight += 1
        e.last_used_s = t
        e.idle_token += 1
        self.push(t + e.m.service_s(r), "done", e.m.name)

    def retry_blocked(self, t: float) -> None:
        for item in sorted(self.blocked):
            _, _, name = item
            e = self.eng[name]
            if e.blocked and self.try_admit(e, t):
                self.blocked.remove(item)


def simulate(models: list[SimModel], fleet: Fleet, requests: list[Request], policy: Policy) -> SimReport:
    sim = _Sim(models, fleet, policy)
    for i, r in enumerate(requests):
        sim.push(r.t_s, "arrive", r.model, i)
    unknown = 0
    end = 0.0
    while sim.events:
        t, _, kind, name, arg = heapq.heappop(sim.events)
        end = t
        e = sim.eng.get(name)
        if e is None:
            unknown += 1
            continue
        if kind == "arrive":
            r = requests[arg]
            if e.state == "ready":
                sim.serve(e, arg, r.t_s, t, r)
            else:
                e.waiters.append((arg, r.t_s))
                if e.state in ("off", "asleep") and not e.blocked and not sim.try_admit(e, t):
                    e.blocked = True
                    sim.blocked.append((-e.m.priority, t, name))
        elif kind == "ready":
            e.state = "ready"
            waiting, e.waiters = e.waiters, []
            for idx, arrival in waiting:
                sim.serve(e, idx, arrival, t, requests[idx])
        elif kind == "done":
            e.inflight -= 1
            e.last_used_s = t
            if e.inflight == 0 and not e.m.resident and policy.eviction == "keep-alive":
                if policy.keep_alive_s == 0:
                    sim._evict(e, "off", expiry=True)
                elif policy.keep_alive_s > 0:
                    sim.push(t + policy.keep_alive_s, "expire", name, e.idle_token)
            sim.retry_blocked(t)
        elif kind == "expire":
            if e.state == "ready" and e.inflight == 0 and arg == e.idle_token:
                sim._evict(e, "off", expiry=True)
                sim.retry_blocked(t)
    return _report(sim, requests, policy, unknown, end)


def _report(sim: _Sim, requests: list[Request], policy: Policy, unknown: int, end: float) -> SimReport:
    per_model: dict[str, list[float]] = {n: [] for n in sim.eng}
    per_prio: dict[int, list[float]] = {}
    for i, r in enumerate(requests):
        if r.model not in sim.eng:
            continue
        wait = sim.added.get(i, math.inf)  # inf: never served (its model could never load)
        per_model[r.model].append(wait)
        per_prio.setdefault(sim.eng[r.model].m.priority, []).append(wait)
    models = []
    for name, e in sim.eng.items():
        waits = per_model[name]
        c = sim.counts[name]
        models.append(
            ModelStats(
                name,
                e.m.priority,
                e.m.resident,
                len(waits),
                c["cold"],
                c["wake"],
                sum(1 for w in waits if w > 0),
                c["evict"],
                c["expire"],
                round(_percentile_or_zero(waits, 50) * 1000, 3),
                round(_percentile_or_zero(waits, 95) * 1000, 3),
                round(_percentile_or_zero(waits, 99) * 1000, 3),
                round(max(waits, default=0.0) * 1000, 3),
            )
        )
    prios = [
        PriorityStats(
            p,
            len(w),
            sum(1 for x in w if x > 0),
            round(_percentile_or_zero(w, 95) * 1000, 3),
            round(max(w) * 1000, 3),
            round(sum(w), 6),
        )
        for p, w in sorted(per_prio.items(), reverse=True)
    ]
    return SimReport(
        policy.eviction,
        policy.keep_alive_s,
        len(requests),
        unknown,
        sum(m.cold_starts for m in models),
        sum(m.evictions for m in models),
        tuple(models),
        tuple(prios),
        round(end, 6),
    )
