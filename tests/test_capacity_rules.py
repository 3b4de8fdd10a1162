"""Release rules (capacity/rules.py) and the two-release comparison (capacity/regression.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramlab.capacity import EngineSettings, get_gpu
from vramlab.capacity.planning import sweep
from vramlab.capacity.regression import compare
from vramlab.capacity.rules import DESCRIBED, ReleaseRule, crossed, release_rules
from vramlab.sources import resolve_model

H100 = get_gpu("h100-80gb")


def test_every_release_keyed_constant_says_what_it_moves():
    """A version constant in the capacity modules without an entry in rules.DESCRIBED fails here: describe it
    there (engine, what changes, what it moves, where it was read)."""
    rules = release_rules()
    assert not [r.name for r in rules if r.described is None]
    assert not set(DESCRIBED) - {r.name for r in rules}, "described rules that no module defines"
    assert {"UTIL_092_FROM", "SGLANG_DRAFT_IN_BUDGET_FROM", "LLAMACPP_SHARED_DRAFT_CTX_FROM"} <= {
        r.name for r in rules
    }


def test_rules_crossed_between_two_releases():
    assert {r.name for r in crossed("vllm", "0.19.0", "0.20.0")} == {"UTIL_092_FROM", "GRAPH_ESTIMATE_FROM"}
    assert crossed("vllm", "0.25.1", "0.26.0") == []
    # a range rule: in force for 0.7.1-0.7.x only
    assert [r.name for r in crossed("vllm", "0.7.0", "0.7.3")] == ["V0_MLA_ABSORPTION"]
    # a table rule: TGI's warm-up room steps at 3.0, 3.1 and 3.3
    assert "CARD_WIGGLE" in {r.name for r in crossed("tgi", "3.0.2", "3.1.0")}
    assert "CARD_WIGGLE" not in {r.name for r in crossed("tgi", "3.1.0", "3.2.3")}


@given(
    st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(0, 9)),
    st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(0, 9)),
)
def test_crossing_is_symmetric_and_empty_for_the_same_release(a, b):
    va, vb = ".".join(map(str, a)), ".".join(map(str, b))
    assert {r.name for r in crossed("vllm", va, vb)} == {r.name for r in crossed("vllm", vb, va)}
    assert crossed("sglang", va, va) == []


def test_a_range_rule_answers_inside_its_releases_only():
    rule = ReleaseRule("X", "defaults", "range", ((0, 5, 1), (0, 6, 5)), None)
    assert [rule.answer(v) for v in ((0, 5), (0, 5, 1), (0, 6, 4), (0, 6, 5))] == [0, 1, 1, 0]


def test_comparison_names_the_rule_behind_each_moved_component():
    llama = resolve_model("llama-3.1-8b-instruct")
    base = EngineSettings(engine="vllm", engine_version="0.19.0", max_model_len=8192)
    result = compare(llama, H100, base, "0.20.0")
    changes = {c.item: c for c in result.changes}
    # gpu_memory_utilization 0.9 -> 0.92 of the card's 85,029,615,042 B: the budget grows by 0.02 of it
    budget = changes["budget_bytes"]
    assert budget.b - budget.a == pytest.approx(0.02 * H100.memory_bytes, abs=1)
    assert budget.rules == ("UTIL_092_FROM",)
    assert changes["gpu_memory_utilization"].rules == ("UTIL_092_FROM",)
    # 0.20 takes the CUDA-graph estimate from the budget: the component moves inside it
    graphs = changes["cuda_graphs.in_budget"]
    assert (graphs.a, graphs.b, graphs.rules) == (False, True, ("GRAPH_ESTIMATE_FROM",))
    # the pool inherits both, through what moved
    pool = changes["kv_cache"]
    assert set(pool.rules) == {"UTIL_092_FROM", "GRAPH_ESTIMATE_FROM"} and "budget_bytes" in pool.through
    assert result.unexplained == []
    assert "weights" not in changes


def test_sglang_heuristic_release_moves_the_fraction():
    llama = resolve_model("llama-3.1-8b-instruct")
    result = compare(
        llama, H100, EngineSettings(engine="sglang", engine_version="0.5.2", max_model_len=8192), "0.5.3"
    )
    fraction = {c.item: c for c in result.changes}["mem_fraction_static"]
    assert "NEW_HEURISTIC_FROM" in fraction.rules
    assert fraction.b == 0.834  # (79.19 - 13.125) / 79.19, see tests/test_capacity_speculative.py


def test_gemma_between_0251_and_026_nothing_modelled_changes():
    """vllm-project/vllm issue 49878 reports a Gemma 4 pool ~40 % larger on 0.26 than on 0.25.1: no rule vramlab
    models changes between those releases, so the plans are equal and the comparison says so."""
    gemma = resolve_model("gemma-3-27b-it")
    result = compare(
        gemma, H100, EngineSettings(engine="vllm", engine_version="0.25.1", max_model_len=32768), "0.26.0"
    )
    assert result.rules == () and result.changes == ()


def test_a_release_that_refuses_is_reported_not_raised():
    llama = resolve_model("llama-3.1-8b-instruct")
    base = EngineSettings(engine="vllm", vllm_engine="v0", engine_version="0.10.2", max_model_len=8192)
    result = compare(llama, H100, base, "0.11.0")
    assert "0.11.0" in result.errors and "no V0 engine" in result.errors["0.11.0"]
    assert [(c.item, c.a, c.b) for c in result.changes] == [("start-up", "starts", "refused")]
    assert "V0_REMOVED_IN" in result.changes[0].rules


def test_a_sweep_over_releases_names_the_rules_per_row():
    llama = resolve_model("llama-3.1-8b-instruct")
    result = sweep(
        llama,
        H100,
        EngineSettings(engine="vllm", max_model_len=8192),
        [("engine_version", ["0.19.0", "0.20.0"]), ("max_num_seqs", [64, 256])],
    )
    rows = {(r["engine_version"], r["max_num_seqs"]): r for r in result.rows}
    assert "rules_changed" not in rows[("0.19.0", 64)]
    assert set(rows[("0.20.0", 256)]["rules_changed"]) == {"UTIL_092_FROM", "GRAPH_ESTIMATE_FROM"}


def test_sglang_0513_to_0514_names_the_draft_budget_rule():
    from test_capacity_speculative import EAGLE3_HEAD
    from vramlab.capacity.settings import Speculative
    from vramlab.sources.hf_config import spec_from_config

    head = spec_from_config(EAGLE3_HEAD, "eagle3-head", "test config")
    llama = resolve_model("llama-3.1-8b-instruct")
    settings = EngineSettings(
        engine="sglang", engine_version="0.5.13", max_model_len=8192, speculative=Speculative("eagle3", head)
    )
    changes = {c.item: c for c in compare(llama, H100, settings, "0.5.14").changes}
    # 0.5.10-0.5.13 keep 4 GiB for the draft: (79.19 - 17.125) / 79.19 = 0.784; 0.5.14 budgets it: 0.834
    fraction = changes["mem_fraction_static"]
    assert (fraction.a, fraction.b) == (0.784, 0.834)
    assert fraction.rules == ("SGLANG_DRAFT_IN_BUDGET_FROM",)  # the 4 GiB rule (0.5.10) is not crossed
    assert changes["draft_weights.in_budget"].rules == ("SGLANG_DRAFT_IN_BUDGET_FROM",)
    assert changes["draft_kv"].b is None and changes["draft_kv"].rules == ("SGLANG_DRAFT_IN_BUDGET_FROM",)
    assert changes["kv_bytes_per_token"].b == 135_168
