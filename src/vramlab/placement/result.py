"""`vramlab pack` end to end: residency, placement, settings, advice, simulation; JSON and table.

`plan_fleet` is the one library call the CLI makes. The JSON object it renders is documented in
docs/pack.md (`schema: vramlab.pack/1`); byte figures are integers in bytes, per GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from vramlab.placement.demand import DemandFn, best_option
from vramlab.placement.explain import Change, explain
from vramlab.placement.inputs import Inputs, Policy
from vramlab.placement.pack import PackResult, pack
from vramlab.placement.residency import Request, SimReport, decide, sim_models, simulate
from vramlab.placement.settings import CardCheck, InstanceSettings, engine_settings
from vramlab.units import gib

SCHEMA = "vramlab.pack/1"


@dataclass(frozen=True)
class FleetPlan:
    inputs: Inputs
    policy: Policy
    residency: dict[str, tuple[str, str]]  # name -> (mode, why)
    result: PackResult
    settings: tuple[InstanceSettings, ...]
    checks: tuple[CardCheck, ...]
    changes: tuple[Change, ...]
    simulation: SimReport | None = None

    @property
    def feasible(self) -> bool:
        return (
            self.result.feasible
            and all(not s.problems for s in self.settings)
            and all(c.fits for c in self.checks)
        )


def plan_fleet(
    inputs: Inputs,
    demand_fn: DemandFn,
    method: str = "auto",
    policy: Policy | None = None,
    trace: list[Request] | None = None,
) -> FleetPlan:
    policy = policy or inputs.policy
    fleet, instances = inputs.fleet, inputs.instances
    rates: dict[str, float] = {}
    if trace:
        span = max(r.t_s for r in trace) - min(r.t_s for r in trace) or 1.0
        for r in trace:
            rates[r.model] = rates.get(r.model, 0.0) + 1 / span
    residency: dict[str, tuple[str, str]] = {}
    for inst in instances:
        weights = 0
        for node in fleet.nodes:
            d = best_option(inst, fleet.node_cards(node)[0], demand_fn, len(fleet.node_cards(node)))
            if d is not None:
                weights = d.weights_bytes * d.tp
                break
        residency[inst.name] = decide(inst, weights, policy, rates.get(inst.name))
    modes = {n: m for n, (m, _) in residency.items()}
    result = pack(instances, fleet, demand_fn, method=method, exact_limit=policy.exact_limit, residency=modes)
    settings, checks = engine_settings(result, instances, demand_fn, policy)
    changes = tuple(explain(instances, fleet, demand_fn, result, method=method, residency=modes))
    sim = None
    if trace is not None:
        placed = {p.instance for p in result.placements}
        sim = simulate([m for m in sim_models(result, instances) if m.name in placed], fleet, trace, policy)
    return FleetPlan(inputs, policy, residency, result, tuple(settings), tuple(checks), changes, sim)


# --- JSON ----------------------------------------------------------------------------------------
def _demand_json(d: Any) -> dict[str, Any]:
    return {
        "weights_bytes": d.weights_bytes,
        "kv_cache_bytes": d.kv_cache_bytes,
        "activation_bytes": d.activation_bytes,
        "overhead_bytes": d.overhead_bytes,
        "margin_bytes": d.margin_bytes,
        "used_bytes": d.used_bytes,
        "total_bytes": d.total_bytes,
        "max_concurrency": round(d.max_concurrency, 2),
        "knobs": dict(d.knobs),
    }


def to_json(plan: FleetPlan) -> dict[str, Any]:
    fleet = plan.inputs.fleet
    by_name = {s.instance: s for s in plan.settings}
    cards = []
    for check in plan.checks:
        card = fleet.cards[check.card]
        cards.append(
            {
                "card": card.index,
                "label": card.label,
                "node": card.node,
                "gpu": card.gpu_name,
                "memory_bytes": card.memory_bytes,
                "resident_used_bytes": check.resident_used_bytes,
                "resident_margin_bytes": check.resident_margin_bytes,
                "free_bytes": card.memory_bytes - check.resident_used_bytes - check.resident_margin_bytes,
                "vllm_utilization_sum": check.vllm_utilization_sum,
                "outside_budget_bytes": check.outside_budget_bytes,
                "fits": check.fits,
                "instances": [p.instance for p in plan.result.on_card(card.index)],
            }
        )
    instances = []
    for inst in plan.inputs.instances:
        mode, why = plan.residency[inst.name]
        s = by_name.get(inst.name)
        row: dict[str, Any] = {
            "name": inst.name,
            "model": inst.model,
            "engine": inst.engine,
            "priority": inst.priority,
            "residency": mode,
            "residency_reason": why,
            "placed": s is not None,
        }
        if s is not None:
            row |= {
                "cards": list(s.cards),
                "tp": s.tp,
                "start_order": s.start_order,
                "start_after": list(s.start_after),
                "other_processes_bytes": s.other_processes_bytes,
                "flags": s.flags,
                "env": s.env,
                "command": s.command,
                "problems": list(s.problems),
                "demand": _demand_json(s.demand),
            }
        else:
            row["why_not"] = dict(plan.result.unplaced).get(inst.name, "")
        instances.append(row)
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "feasible": plan.feasible,
        "method": plan.result.method,
        "policy": {"eviction": plan.policy.eviction, "keep_alive_s": plan.policy.keep_alive_s},
        "cards_total": len(fleet.cards),
        "cards_used": len(plan.result.cards_used),
        "cards": cards,
        "instances": instances,
        "unplaced": [{"instance": n, "why": w} for n, w in plan.result.unplaced],
        "changes": [asdict(c) for c in plan.changes],
        "notes": list(plan.result.notes),
    }
    if plan.simulation is not None:
        sim = plan.simulation
        inf = float("inf")
        fix: Callable[[Any], Any] = lambda v: None if v == inf else v  # noqa: E731  (JSON has no infinity: never served)
        out["simulation"] = {
            "policy": sim.policy,
            "keep_alive_s": sim.keep_alive_s,
            "requests": sim.requests,
            "unknown_model_requests": sim.unknown_model_requests,
            "cold_starts": sim.cold_starts,
            "evictions": sim.evictions,
            "end_s": sim.end_s,
            "models": [{k: fix(v) for k, v in asdict(m).items()} for m in sim.models],
            "priorities": [{k: fix(v) for k, v in asdict(p).items()} for p in sim.priorities],
        }
    return out


# --- table ---------------------------------------------------------------------------------------
def _flags_text(flags: dict[str, Any]) -> str:
    return " ".join(k if v is True else f"{k} {v}" for k, v in flags.items())


def render_table(plan: FleetPlan) -> str:
    fleet, r = plan.inputs.fleet, plan.result
    placed = sum(1 for i in plan.inputs.instances if r.placement(i.name))
    lines = [
        f"pack: {len(r.cards_used)} of {len(fleet.cards)} cards used, {placed} of "
        f"{len(plan.inputs.instances)} instances placed ({r.method} search); figures in GiB (2^30 bytes), per GPU"
    ]
    by_name = {s.instance: s for s in plan.settings}
    for check in plan.checks:
        card = fleet.cards[check.card]
        free = card.memory_bytes - check.resident_used_bytes - check.resident_margin_bytes
        util = f"  vLLM util sum {check.vllm_utilization_sum:.3f}" if check.vllm_utilization_sum else ""
        lines += [
            "",
            f"{card.label}  {card.gpu_name}  {gib(card.memory_bytes)} GiB: used {gib(check.resident_used_bytes)}"
            f"  margin {gib(check.resident_margin_bytes)}  free {gib(free)}{util}"
            + ("" if check.fits else "  OVER"),
        ]
        for p in sorted(
            r.on_card(card.index), key=lambda p: (p.residency != "resident", -p.demand.total_bytes)
        ):
            s, d = by_name[p.instance], p.demand
            order = f"#{s.start_order}" if s.start_order else "od"
            lines.append(
                f"  {order:>3} {p.instance:<18} {s.engine:<7} tp{p.tp}  w {gib(d.weights_bytes)}  "
                f"kv {gib(d.kv_cache_bytes)}  act {gib(d.activation_bytes)}  ovh {gib(d.overhead_bytes)}  "
                f"= {gib(d.used_bytes)}  {p.residency}"
            )
            lines.append(f"        {_flags_text(s.flags)}")
            lines += [f"        ! {problem}" for problem in s.problems]
    residents = sorted((s for s in plan.settings if s.start_order), key=lambda s: s.start_order)
    if residents:
        lines += [
            "",
            "start order (one at a time, each after the previous is healthy; engines started together "
            "miscount each other's memory):",
        ]
        lines += [
            f"  {s.start_order}. {s.instance} on {', '.join(fleet.cards[c].label for c in s.cards)}"
            for s in residents
        ]
    lines += ["", "residency:"]
    lines += [residency_line(plan, n, m, why) for n, (m, why) in plan.residency.items()]
    if r.unplaced:
        lines += ["", "does not fit:"] + [f"  {n}: {why}" for n, why in r.unplaced]
        if plan.changes:
            lines += ["", "smallest changes that make it fit (each tried through the capacity model):"]
            lines += [f"  - {c.description} -> {c.cards_used} cards" for c in plan.changes]
        else:
            lines += [
                "",
                "no single change tried (shorter context, fp8 KV, fewer sequences, TP, fp8/4-bit "
                "weights, one more card) makes it fit",
            ]
    lines += [f"note: {n}" for n in r.notes]
    if plan.simulation is not None:
        lines += ["", *render_simulation(plan.simulation)]
    return "\n".join(lines)


def residency_line(plan: FleetPlan, name: str, mode: str, why: str) -> str:
    """What became of one instance: resident or on-demand where it was placed, "not placed" (with
    what it would have been) where pack found no room, so the table never calls it resident."""
    if plan.result.placement(name) is None:
        return f"  {name:<18} {'not placed':<10} (would be {mode}: {why}); see 'does not fit'"
    return f"  {name:<18} {mode:<10} {why}"


def render_simulation(sim: SimReport) -> list[str]:
    ka = f", keep-alive {sim.keep_alive_s:g} s" if sim.policy == "keep-alive" else ""
    lines = [
        f"simulation: {sim.requests} requests, policy {sim.policy}{ka}: {sim.cold_starts} cold starts, "
        f"{sim.evictions} evictions",
        f"  {'model':<18} {'prio':>4} {'reqs':>5} {'cold':>5} {'wakes':>5} {'evict':>5} {'expire':>6} "
        f"{'added p50 ms':>12} {'p95 ms':>10} {'p99 ms':>10}",
    ]
    fmt: Callable[[float], str] = lambda v: "never" if v == float("inf") else f"{v:.0f}"  # noqa: E731
    for m in sim.models:
        lines.append(
            f"  {m.model:<18} {m.priority:>4} {m.requests:>5} {m.cold_starts:>5} {m.wakes:>5} "
            f"{m.evictions:>5} {m.expiries:>6} {fmt(m.added_p50_ms):>12} {fmt(m.added_p95_ms):>10} "
            f"{fmt(m.added_p99_ms):>10}"
        )
    if sim.priorities:
        top = sim.priorities[0]
        lines.append(
            f"  priority {top.priority} (highest): {top.delayed} of {top.requests} requests waited, "
            f"p95 wait {fmt(top.wait_p95_ms)} ms, max {fmt(top.wait_max_ms)} ms"
        )
    if sim.unknown_model_requests:
        lines.append(f"  {sim.unknown_model_requests} requests named a model not in the plan (ignored)")
    return lines


def with_policy(policy: Policy, eviction: str | None, keep_alive_s: float | None) -> Policy:
    """Command-line overrides of the models file's policy."""
    if eviction is not None:
        policy = replace(policy, eviction=eviction)
    if keep_alive_s is not None:
        from vramlab.errors import ConfigError
        from vramlab.placement.inputs import check_keep_alive

        try:
            check_keep_alive(keep_alive_s)
        except ValueError as exc:
            raise ConfigError(f"--keep-alive-s: {exc}") from None
        policy = replace(policy, keep_alive_s=keep_alive_s)
    return policy
