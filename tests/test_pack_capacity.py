"""Placement on the real capacity model: plans marked feasible must fit when recomputed from the
emitted flags, and more models never need less memory."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement_fakes import fleet
from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.placement.demand import CapacityDemand
from vramlab.placement.explain import explain
from vramlab.placement.inputs import Instance, Policy
from vramlab.placement.pack import pack
from vramlab.placement.settings import engine_settings
from vramlab.sources import resolve_model

MODELS = [
    "qwen2.5-0.5b-instruct",
    "llama-3.2-1b-instruct",
    "qwen2.5-3b-instruct",
    "qwen2.5-7b-instruct",
    "llama-3.1-8b-instruct",
    "mistral-7b-instruct-v0.3",
]
DEMAND = CapacityDemand()  # shared: its cache keeps the property tests fast

instances = st.lists(
    st.builds(
        lambda m, e, c, ctx: (m, e, c, ctx),
        st.sampled_from(MODELS),
        st.sampled_from(["vllm", "sglang"]),
        st.integers(1, 8),
        st.sampled_from([2048, 4096, 8192]),
    ),
    min_size=1,
    max_size=4,
)


def make(rows: list[tuple[str, str, int, int]]) -> list[Instance]:
    return [
        Instance(name=f"i{k}", model=m, engine=e, concurrency=c, context_tokens=ctx, tp_options=(1, 2))
        for k, (m, e, c, ctx) in enumerate(rows)
    ]


FLEET = fleet(("edge", "l4", 2, 22.49), ("big", "a100-40gb", 1, 39.56))


def recompute(inst: Instance, flags: dict, gpu_name: str, other: int, tp: int):
    """The capacity model's answer for exactly the flags pack emitted, started after `other` bytes."""
    kw: dict[str, Any] = {
        "gpu_memory_utilization": flags.get("--gpu-memory-utilization"),
        "mem_fraction_static": flags.get("--mem-fraction-static"),
    }
    s = EngineSettings(
        engine=inst.engine,
        max_model_len=inst.context_tokens,
        max_num_seqs=inst.concurrency,
        tensor_parallel_size=tp,
        other_processes_bytes=other,
        **kw,
    )
    return estimate(resolve_model(inst.model), get_gpu(gpu_name), s)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances)
def test_a_plan_marked_feasible_fits_under_the_capacity_model(rows: list[tuple[str, str, int, int]]) -> None:
    insts = make(rows)
    result = pack(insts, FLEET, DEMAND)
    out, checks = engine_settings(result, insts, DEMAND, Policy())
    if not (result.feasible and all(c.fits for c in checks) and not any(s.problems for s in out)):
        return
    by_name = {i.name: i for i in insts}
    for card in result.cards_used:
        gpu = FLEET.cards[card].gpu_name
        held = 0
        for s in sorted((s for s in out if card in s.cards), key=lambda s: s.start_order):
            est = recompute(by_name[s.instance], s.flags, gpu, held, s.tp)
            assert est.fits, (s.instance, est.reasons)
            lim = est.pessimistic or est
            assert lim.max_concurrency >= by_name[s.instance].concurrency
            held += est.used_bytes
        assert held <= FLEET.cards[card].memory_bytes


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances, st.sampled_from(MODELS))
def test_adding_a_model_never_lowers_total_memory_demand(
    rows: list[tuple[str, str, int, int]], extra: str
) -> None:
    big = fleet(("n", "a100-80gb", 8, 79.15))
    before = make(rows)
    after = before + [
        Instance(name="extra", model=extra, concurrency=2, context_tokens=4096, tp_options=(1, 2))
    ]

    def total(insts: list[Instance]) -> int:
        r = pack(insts, big, DEMAND, method="ffd")
        out, _ = engine_settings(r, insts, DEMAND, Policy())
        return sum(s.demand.total_bytes * s.tp for s in out)

    assert total(after) > total(before)


def test_vllm_utilisations_on_a_shared_card_leave_room_for_context_outside_them() -> None:
    insts = [
        Instance(name="a", model="qwen2.5-3b-instruct", concurrency=4, context_tokens=4096, tp_options=(1,)),
        Instance(
            name="b", model="llama-3.2-1b-instruct", concurrency=8, context_tokens=4096, tp_options=(1,)
        ),
    ]
    one = fleet(("n", "l4", 1, 22.49))
    r = pack(insts, one, DEMAND)
    assert r.feasible and r.cards_used == (0,)
    out, (check,) = engine_settings(r, insts, DEMAND, Policy())
    utils = [s.flags["--gpu-memory-utilization"] for s in out]
    assert sum(utils) == pytest.approx(
        check.vllm_utilization_sum, abs=1e-9
    )  # 3-d.p. flags, 3-d.p. sum (float sum)
    # shares of the whole card, plus what each process holds outside its share, fit the card
    assert (
        check.vllm_utilization_sum * one.cards[0].memory_bytes + check.outside_budget_bytes
        <= one.cards[0].memory_bytes
    )
    assert [s.start_order for s in out] == [1, 2] and out[1].start_after == (out[0].instance,)


def test_infeasible_long_context_gets_a_shorter_max_model_len_that_really_fits() -> None:
    one = fleet(("n", "l4", 1, 22.49))
    insts = [
        Instance(
            name="chat", model="llama-3.1-8b-instruct", concurrency=4, context_tokens=16384, tp_options=(1,)
        )
    ]
    r = pack(insts, one, DEMAND)
    assert not r.feasible
    changes = explain(insts, one, DEMAND, r)
    by_kind = {c.kind: c for c in changes}
    assert "max_model_len" in by_kind and "kv_cache_dtype" in by_kind
    x = by_kind["max_model_len"].value
    assert isinstance(x, int) and 0 < x < 16384
    shorter = [insts[0].with_(context_tokens=x)]
    assert pack(shorter, one, DEMAND).feasible
    assert not pack([insts[0].with_(context_tokens=x + 256)], one, DEMAND).feasible


def test_sglang_fraction_counts_what_started_before_it() -> None:
    card = fleet(("n", "a100-80gb", 1, 79.15))
    big = Instance(
        name="big", model="llama-3.1-8b-instruct", concurrency=16, context_tokens=8192, tp_options=(1,)
    )
    sg = Instance(
        name="sg",
        model="qwen2.5-3b-instruct",
        engine="sglang",
        concurrency=4,
        context_tokens=4096,
        tp_options=(1,),
    )
    alone = engine_settings(pack([sg], card, DEMAND), [sg], DEMAND, Policy())[0][0]
    out, (check,) = engine_settings(pack([big, sg], card, DEMAND), [big, sg], DEMAND, Policy())
    first, second = sorted(out, key=lambda s: s.start_order)
    assert (first.instance, second.instance) == ("big", "sg") and check.fits
    # SGLang's share is of the memory free when it starts (model_runner's min_per_gpu_memory, taken after
    # the other engine is up): started second, its weights and pool come out of what the first one left
    frac = second.flags["--mem-fraction-static"]
    assert frac != alone.flags["--mem-fraction-static"]
    free_at_start = card.cards[0].memory_bytes - second.other_processes_bytes
    assert frac * free_at_start >= second.demand.weights_bytes
    assert frac * card.cards[0].memory_bytes < second.other_processes_bytes + second.demand.weights_bytes
