"""Per-instance engine flags for co-residence, and the order to start the engines in.

The engines' knobs mean different things on a shared card:
- vLLM `--gpu-memory-utilization` is a share of the *whole* card for this instance alone; the
  CUDA context and NCCL sit outside it. Co-resident vLLM instances need shares that, with those
  outside bytes, sum to at most the card (vLLM docs: "two instances ... 0.5 for each").
- SGLang `--mem-fraction-static` is the share, for its weights and KV pool, of the memory that was
  free when it started (model_runner's `min_per_gpu_memory`, after other processes took theirs);
  what it leaves is for its own activations and graphs. So its value depends on who started before it.
Engines started at the same moment charge each other's loading to themselves and size their KV
cache too small or negative (vLLM #55827): start them one at a time, largest first, each after the
previous is healthy. The knobs here are solved through the capacity model for that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlab.engines import ENGINES
from vramlab.placement.demand import Demand, DemandFn
from vramlab.placement.inputs import Fleet, Instance, Policy
from vramlab.placement.pack import PackResult, Placement

# EngineSettings field -> flag, per engine, for settings the user passed through.
_PASS_THROUGH = {
    "vllm": {
        "kv_cache_dtype": "--kv-cache-dtype",
        "quantization": "--quantization",
        "dtype": "--dtype",
        "enforce_eager": "--enforce-eager",
        "block_size": "--block-size",
        "max_num_batched_tokens": "--max-num-batched-tokens",
    },
    "sglang": {
        "kv_cache_dtype": "--kv-cache-dtype",
        "quantization": "--quantization",
        "dtype": "--dtype",
        "chunked_prefill_size": "--chunked-prefill-size",
        "cuda_graph_max_bs": "--cuda-graph-max-bs",
    },
    "tgi": {
        "quantization": "--quantize",
        "dtype": "--dtype",
        "max_batch_prefill_tokens": "--max-batch-prefill-tokens",
    },
    "llama.cpp": {"n_ubatch": "-ub", "flash_attn": "-fa"},
    "transformers": {},
}


@dataclass(frozen=True)
class InstanceSettings:
    instance: str
    engine: str
    residency: str
    cards: tuple[int, ...]
    tp: int
    start_order: int  # 1-based over resident instances; on-demand ones start when first asked
    start_after: tuple[str, ...]  # instances sharing a card that must be healthy first
    other_processes_bytes: int  # what earlier instances hold on its busiest card when it starts
    flags: dict[str, Any]
    env: dict[str, str]
    command: str
    demand: Demand  # solved for this start order
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class CardCheck:
    card: int
    memory_bytes: int
    resident_used_bytes: int
    resident_margin_bytes: int
    vllm_utilization_sum: float  # sum of co-resident vLLM --gpu-memory-utilization
    outside_budget_bytes: int  # what those vLLM instances hold outside their share (context, NCCL)
    fits: bool


def _flags(inst: Instance, p: Placement, d: Demand, policy: Policy) -> dict[str, Any]:
    e, s = inst.engine, inst.settings_dict()
    f: dict[str, Any] = {}
    if e == "vllm":
        f["--gpu-memory-utilization"] = d.knobs.get("gpu_memory_utilization", s.get("gpu_memory_utilization"))
        f["--max-model-len"] = inst.context_tokens
        f["--max-num-seqs"] = inst.concurrency
        if p.tp > 1:
            f["--tensor-parallel-size"] = p.tp
        if policy.eviction in ("sleep-1", "sleep-2") and p.residency == "on-demand":
            f["--enable-sleep-mode"] = True
    elif e == "sglang":
        f["--mem-fraction-static"] = d.knobs.get("mem_fraction_static", s.get("mem_fraction_static"))
        f["--context-length"] = inst.context_tokens
        f["--max-running-requests"] = inst.concurrency
        if p.tp > 1:
            f["--tp-size"] = p.tp
    elif e == "tgi":
        f["--max-total-tokens"] = inst.context_tokens
        f["--max-concurrent-requests"] = inst.concurrency
        if p.tp > 1:
            f["--num-shard"] = p.tp
    elif e == "llama.cpp":
        f["-c"] = inst.context_tokens * inst.concurrency  # split across -np slots
        f["-np"] = inst.concurrency
        f["-ngl"] = 999
    for key, flag in _PASS_THROUGH.get(e, {}).items():
        if s.get(key) not in (None, "auto", False):
            f[flag] = s[key]
    if inst.quantization and "--quantization" not in f and e in ("vllm", "sglang"):
        f["--quantization"] = inst.quantization
    return {k: v for k, v in f.items() if v is not None}


def _command(inst: Instance, flags: dict[str, Any]) -> str:
    parts = [ENGINES[inst.engine].serve_command or inst.engine, inst.model]
    for k, v in flags.items():
        parts.append(k if v is True else f"{k} {v}")
    return " ".join(parts)


def engine_settings(
    result: PackResult, instances: tuple[Instance, ...] | list[Instance], demand_fn: DemandFn, policy: Policy
) -> tuple[list[InstanceSettings], list[CardCheck]]:
    """Flags, environment and start order for every placed instance, and a check of each card."""
    by_name = {i.name: i for i in instances}
    fleet = result.fleet
    residents = sorted(
        (p for p in result.placements if p.residency == "resident"),
        key=lambda p: (-p.demand.total_bytes, -p.tp, p.instance),
    )
    started: dict[int, list[tuple[str, Demand]]] = {c.index: [] for c in fleet.cards}
    out: list[InstanceSettings] = []
    for order, p in enumerate(residents, 1):
        inst = by_name[p.instance]
        before = max(sum(d.used_bytes for _, d in started[c]) for c in p.cards)
        after = tuple(dict.fromkeys(n for c in p.cards for n, _ in started[c]))
        d = demand_fn(inst, fleet.cards[p.cards[0]], p.tp, before)
        problems = () if d.fits else (f"does not fit after {', '.join(after)}: {d.reason}",)
        for c in p.cards:
            started[c].append((p.instance, d))
        out.append(_settings(fleet, inst, p, d, policy, order, after, before, problems))
    for p in (p for p in result.placements if p.residency == "on-demand"):
        inst = by_name[p.instance]
        # Loaded on demand once the residents run; other on-demand engines are evicted for it.
        before = max(sum(d.used_bytes for _, d in started[c]) for c in p.cards)
        after = tuple(dict.fromkeys(n for c in p.cards for n, _ in started[c]))
        d = demand_fn(inst, fleet.cards[p.cards[0]], p.tp, before)
        problems = () if d.fits else (f"does not fit next to the residents: {d.reason}",)
        out.append(_settings(fleet, inst, p, d, policy, 0, after, before, problems))
    checks = []
    for c in result.cards_used:
        card = fleet.cards[c]
        ds = [(by_name[n], d) for n, d in started[c]]
        used = sum(d.used_bytes for _, d in ds)
        margin = sum(d.margin_bytes for _, d in ds)
        util = sum(d.knobs.get("gpu_memory_utilization", 0.0) for i, d in ds if i.engine == "vllm")
        outside = sum(
            d.used_bytes - int(d.knobs["gpu_memory_utilization"] * card.memory_bytes)
            for i, d in ds
            if i.engine == "vllm" and "gpu_memory_utilization" in d.knobs
        )
        checks.append(
            CardCheck(
                c,
                card.memory_bytes,
                used,
                margin,
                round(util, 3),
                max(0, outside),
                used + margin <= card.memory_bytes,
            )
        )
    return out, checks


def _settings(
    fleet: Fleet,
    inst: Instance,
    p: Placement,
    d: Demand,
    policy: Policy,
    order: int,
    after: tuple[str, ...],
    before: int,
    problems: tuple[str, ...],
) -> InstanceSettings:
    flags = _flags(inst, p, d, policy)
    # Node-local device numbers, as the engine's process sees them.
    fleet_local = ",".join(str(fleet.cards[c].local_index) for c in p.cards)
    return InstanceSettings(
        inst.name,
        inst.engine,
        p.residency,
        p.cards,
        p.tp,
        order,
        after,
        before,
        flags,
        {"CUDA_VISIBLE_DEVICES": fleet_local},
        _command(inst, flags),
        d,
        problems,
    )
