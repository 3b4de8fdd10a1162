"""Plan files: a good one loads; every kind of mistake names file, line and field in one line."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from vramlab.errors import ConfigError
from vramlab.experiment.plan import Plan, load_plan, parse_plan

ROOT = Path(__file__).resolve().parents[1]

GOOD = """\
name: t
target:
  base_url: http://127.0.0.1:8000
  model: m
fixed:
  input:
    synthetic: {prompt_tokens: 10, output_tokens: 4, seed: 1, count: 5}
change:
  variable: concurrency
  steps: [2, 4]
phases:
  duration_s: 1
"""


def _err(text: str, name: str = "plan.yaml") -> str:
    with pytest.raises(ConfigError) as exc:
        parse_plan(text, name)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_example_plans_load() -> None:
    plan = load_plan(ROOT / "examples" / "concurrency-ramp.yaml")
    assert plan.change.values() == [2, 4, 8, 16]
    assert plan.rounds == 3 and plan.baseline_value() == 1
    assert plan.warnings() == []
    assert load_plan(ROOT / "examples" / "demo.yaml").rounds == 3


def test_defaults_and_derived_values() -> None:
    plan = parse_plan(GOOD)
    assert plan.rounds == 3 and plan.load.mode == "closed"
    assert plan.stop_conditions.error_rate == 0.5 and plan.stop_conditions.oom_seen
    # 3 rounds x (baseline + 2 steps + recovery) windows of 1 s (+ up to 1 s drain), twice, + 60 s
    assert plan.wall_clock_s() == pytest.approx(2 * 3 * 4 * 2.0 + 60)
    assert plan.baseline_value() == 1.0


def test_unknown_field_points_at_its_line() -> None:
    text = GOOD.replace("  steps: [2, 4]\n", "  steps: [2, 4]\n  stpes: [8]\n")
    assert _err(text) == "plan.yaml:11: change.stpes: unknown field"


def test_bad_step_value_names_the_index() -> None:
    text = GOOD.replace("steps: [2, 4]", "steps:\n    - 2\n    - nope")
    msg = _err(text)
    assert msg.startswith("plan.yaml:12: change.steps[1]: ")


def test_negative_steps_and_missing_field() -> None:
    assert _err(GOOD.replace("[2, 4]", "[2, -4]")).startswith("plan.yaml:10: change.steps: ")
    msg = _err(GOOD.replace("  model: m\n", ""))
    assert msg == "plan.yaml:2: target.model: required field is missing"


def test_cross_field_error_points_at_the_field() -> None:
    text = GOOD.replace("variable: concurrency", "variable: request_rate")
    assert _err(text) == "plan.yaml:9: change.variable: request_rate needs load.mode: open"
    text = GOOD + "samplers:\n  sources: [ledger]\n"
    assert _err(text).startswith("plan.yaml:14: samplers.sources: 'ledger' needs samplers.ledger")


def test_yaml_syntax_error_has_a_line() -> None:
    msg = _err(GOOD.replace("  model: m", "  model: [m"), "x.yaml")
    assert msg.startswith("x.yaml:") and "not valid YAML" in msg


def test_not_a_mapping_and_missing_file(tmp_path: Path) -> None:
    assert (
        _err("- a\n- b\n")
        == "plan.yaml:1: a plan is a mapping (kind: experiment, name:, target:, ...), got list"
    )
    with pytest.raises(ConfigError, match="no such plan file"):
        load_plan(tmp_path / "nope.yaml")


def test_jsonl_path_is_checked_relative_to_the_plan(tmp_path: Path) -> None:
    text = GOOD.replace(
        "    synthetic: {prompt_tokens: 10, output_tokens: 4, seed: 1, count: 5}", "    jsonl: in.jsonl"
    )
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="fixed.input.jsonl: no such file"):
        load_plan(p)
    (tmp_path / "in.jsonl").write_text('{"prompt": "hi"}\n')
    assert load_plan(p).fixed.input.jsonl == "in.jsonl"


def test_api_key_value_is_refused_as_env_name() -> None:
    text = GOOD.replace("  model: m\n", "  model: m\n  api_key_env: sk-abc123-secret\n")
    assert "NAME of an environment variable" in _err(text)


def test_few_rounds_warn_and_ramp_expands() -> None:
    text = GOOD.replace("  steps: [2, 4]\n", "  ramp: {start: 1, factor: 2, ceiling: 8}\n") + "rounds: 1\n"
    plan = parse_plan(text)
    assert plan.change.values() == [1, 2, 4, 8]
    assert any("fewer than 3" in w for w in plan.warnings())


def test_plan_is_frozen_and_the_document_untouched() -> None:
    doc = yaml.safe_load(GOOD)
    before = copy.deepcopy(doc)
    plan = Plan.model_validate(doc)
    assert doc == before
    with pytest.raises(ValidationError):
        plan.rounds = 5  # type: ignore[misc]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_junk_text_gives_config_error_only(text: str) -> None:
    try:
        parse_plan(text)
    except ConfigError as exc:
        assert str(exc).startswith("plan.yaml:")


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(
        [
            "name",
            "target",
            "fixed",
            "change",
            "phases",
            "rounds",
            "load",
            "stop_conditions",
            "rollback",
            "samplers",
            "metrics",
            "bogus",
        ]
    ),
    _values,
)
def test_junk_values_in_a_good_plan_give_config_error_only(key: str, value: object) -> None:
    doc = yaml.safe_load(GOOD)
    doc[key] = value
    try:
        parse_plan(yaml.safe_dump(doc))
    except ConfigError as exc:
        assert str(exc).startswith("plan.yaml:") and "\n" not in str(exc)


def test_every_engine_the_readme_names_is_a_target_kind() -> None:
    # `target.kind: transformers` was refused although the README lists transformers
    readme = (ROOT / "README.md").read_text().split("\n\n")[1]
    named = {
        "vLLM": "vllm",
        "SGLang": "sglang",
        "TGI": "tgi",
        "llama.cpp": "llama.cpp",
        "transformers": "transformers",
    }
    assert all(word in readme for word in named), readme
    for kind in named.values():
        plan = parse_plan(GOOD.replace("  model: m\n", f"  model: m\n  kind: {kind}\n"))
        assert plan.target.kind == kind
    assert "target.kind" in _err(GOOD.replace("  model: m\n", "  model: m\n  kind: tensorrt-llm\n"))
