"""The residency simulation on synthetic traces whose answers are known by hand."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement_fakes import GIB, fleet, inst
from vramlab.errors import ConfigError
from vramlab.placement.inputs import Policy
from vramlab.placement.residency import Request, SimModel, _percentile_or_zero, decide, load_trace, simulate
from vramlab.records.stats import percentile

CARD = fleet(("a", "l4", 1, 20.0))


def model(
    name: str,
    gib: float = 12.0,
    *,
    priority: int = 0,
    resident: bool = False,
    cold_s: float = 10.0,
    wake1_s: float = 1.0,
    wake2_s: float = 4.0,
    asleep_gib: float = 1.0,
) -> SimModel:
    # 1000 tokens/s decode and no prompt: a request with 1000 output tokens takes exactly 1 s.
    return SimModel(
        name,
        priority,
        (0,),
        int(gib * GIB),
        int(asleep_gib * GIB),
        resident,
        cold_s,
        wake1_s,
        wake2_s,
        prefill_tokens_per_s=1e9,
        decode_tokens_per_s=1000.0,
    )


def alternate(n: int, gap_s: float, names: tuple[str, ...] = ("a", "b")) -> list[Request]:
    return [Request(i * gap_s, names[i % len(names)], 0, 1000) for i in range(n)]


def stats(report, name):
    return next(m for m in report.models if m.model == name)


def test_two_models_alternating_on_a_card_that_fits_one_cold_start_every_request() -> None:
    rep = simulate([model("a"), model("b")], CARD, alternate(10, 60.0), Policy("lru"))
    assert rep.cold_starts == 10
    assert rep.evictions == 9  # every load after the first evicts the other model
    for name in "ab":
        m = stats(rep, name)
        assert m.cold_starts == 5 and m.delayed == 5
        assert m.added_p95_ms == pytest.approx(10_000) and m.added_p99_ms == pytest.approx(10_000)


def test_keep_alive_longer_than_the_gap_only_the_first_request_is_cold() -> None:
    both_fit = [model("a", 8.0), model("b", 8.0)]
    rep = simulate(both_fit, CARD, alternate(40, 60.0), Policy("keep-alive", keep_alive_s=300))
    assert rep.cold_starts == 2 and rep.evictions == 0
    assert all(m.expiries == 1 for m in rep.models)  # once each, after the trace ends
    # one cold request out of twenty per model: the P95 (linear interpolation, 5 % of the way from the
    # last warm request to the cold one) is 500 ms, the max the whole 10 s load
    a = stats(rep, "a")
    assert a.added_p95_ms == pytest.approx(percentile([0.0] * 19 + [10_000.0], 95)) == pytest.approx(500)
    assert a.added_max_ms == pytest.approx(10_000)


def test_keep_alive_shorter_than_the_gap_every_request_is_cold() -> None:
    both_fit = [model("a", 8.0), model("b", 8.0)]
    rep = simulate(both_fit, CARD, alternate(20, 60.0), Policy("keep-alive", keep_alive_s=30))
    assert rep.cold_starts == 20
    assert sum(m.expiries for m in rep.models) == 20 and rep.evictions == 0


def test_sleep_level_1_wakes_over_pcie_instead_of_reloading() -> None:
    # 12 GiB each plus 1 GiB kept by the sleeping process: 12 + 1 <= 20, so the other one sleeps.
    rep = simulate([model("a"), model("b")], CARD, alternate(10, 60.0), Policy("sleep-1"))
    a, b = stats(rep, "a"), stats(rep, "b")
    assert (a.cold_starts, b.cold_starts) == (1, 1)
    assert (a.wakes, b.wakes) == (4, 4)
    assert a.added_max_ms == pytest.approx(10_000)  # the first load is a real start
    assert sorted({w for w in (a.added_p50_ms, b.added_p50_ms)}) == [pytest.approx(1_000)]


def test_sleep_level_2_wakes_by_reloading_weights() -> None:
    rep = simulate([model("a"), model("b")], CARD, alternate(10, 60.0), Policy("sleep-2"))
    assert stats(rep, "a").added_p50_ms == pytest.approx(4_000)


def test_priority_never_evicts_a_more_important_model_and_waits_instead() -> None:
    hi, lo = model("hi", priority=10), model("lo", priority=0)
    trace = [Request(0, "hi", 0, 1000), Request(30, "lo", 0, 1000), Request(31, "hi", 0, 1000)]
    rep = simulate([hi, lo], CARD, trace, Policy("priority"))
    # lo cannot evict hi: it is never loaded and its request never served
    assert stats(rep, "lo").cold_starts == 0 and stats(rep, "lo").added_max_ms == float("inf")
    assert stats(rep, "hi").cold_starts == 1 and rep.evictions == 0
    top = rep.priorities[0]
    assert top.priority == 10 and top.delayed == 1 and top.wait_max_ms == pytest.approx(10_000)


def test_lru_lets_the_low_priority_model_push_the_important_one_out() -> None:
    hi, lo = model("hi", priority=10), model("lo", priority=0)
    trace = [Request(0, "hi", 0, 1000), Request(30, "lo", 0, 1000), Request(60, "hi", 0, 1000)]
    rep = simulate([hi, lo], CARD, trace, Policy("lru"))
    assert stats(rep, "hi").cold_starts == 2 and stats(rep, "hi").evictions == 1
    assert rep.priorities[0].wait_total_s == pytest.approx(20.0)


def test_busy_model_is_not_evicted_the_newcomer_waits_for_it_to_finish() -> None:
    # a's request runs 0..(10+5) s; b arrives at 11 s and may only load once a is idle at 15 s.
    trace = [Request(0, "a", 0, 5000), Request(11, "b", 0, 1000)]
    rep = simulate([model("a"), model("b")], CARD, trace, Policy("lru"))
    assert stats(rep, "b").added_max_ms == pytest.approx((15 - 11 + 10) * 1000)


def test_loads_on_one_card_run_one_at_a_time() -> None:
    both_fit = [model("a", 8.0), model("b", 8.0)]
    rep = simulate(both_fit, CARD, [Request(0, "a"), Request(0, "b")], Policy("lru"))
    assert sorted((stats(rep, "a").added_max_ms, stats(rep, "b").added_max_ms)) == [10_000, 20_000]


def test_residents_never_wait() -> None:
    rep = simulate(
        [model("r", 12.0, resident=True), model("x", 6.0)], CARD, alternate(8, 5.0, ("r", "x")), Policy("lru")
    )
    assert stats(rep, "r").added_max_ms == 0 and stats(rep, "r").cold_starts == 0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 500), st.sampled_from("abc"), st.integers(0, 3000)), min_size=1, max_size=40
    ),
    st.sampled_from(["lru", "priority", "keep-alive", "sleep-1", "sleep-2"]),
)
def test_simulation_is_deterministic_and_serves_everything_it_can(rows, policy) -> None:
    trace = sorted((Request(t, m, 0, o) for t, m, o in rows), key=lambda r: r.t_s)
    models = [model("a", 9.0), model("b", 9.0, priority=5), model("c", 9.0, priority=1)]
    r1 = simulate(models, CARD, trace, Policy(policy, keep_alive_s=60))
    r2 = simulate(models, CARD, trace, Policy(policy, keep_alive_s=60))
    assert r1 == r2
    assert sum(m.requests for m in r1.models) == len(trace)
    if policy != "priority":  # only priority may refuse to evict forever
        assert all(m.added_max_ms < float("inf") for m in r1.models)


def test_residency_percentiles_are_the_shared_definition() -> None:
    assert _percentile_or_zero([1, 2, 3, 4], 50) == percentile([1, 2, 3, 4], 50) == 2.5
    assert _percentile_or_zero([4, 1, 3, 2], 95) == pytest.approx(3.85) and _percentile_or_zero([], 99) == 0


def test_trace_errors_name_the_line(tmp_path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"t_s": 0, "model": "a"}) + "\n" + '{"t_s": -1, "model": "a"}\n')
    with pytest.raises(ConfigError, match=r"t.jsonl:2: t_s must be"):
        load_trace(p)
    p.write_text('{"model": "a"}\n')
    with pytest.raises(ConfigError, match=r":1: missing field 't_s'"):
        load_trace(p)
    p.write_text("not json\n")
    with pytest.raises(ConfigError, match=r":1: "):
        load_trace(p)


def test_decide_resident_or_on_demand() -> None:
    pol = Policy("keep-alive", keep_alive_s=300)
    w = 16 * 10**9  # 16 GB at 2 GB/s + 20 s start = 28 s to load
    assert decide(inst("a", rate_rps=0.001), w, pol)[0] == "on-demand"
    assert decide(inst("a", rate_rps=0.01), w, pol)[0] == "resident"  # 3 requests per keep-alive window
    mode, why = decide(inst("a", rate_rps=0.001, slo_ms=5000), w, pol)
    assert mode == "resident" and "28.0 s" in why
    assert decide(inst("a", residency="on-demand", rate_rps=5), w, pol)[0] == "on-demand"
