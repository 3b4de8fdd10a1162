"""Alert rules from a plan: refused without owner/action, valid for real promtool, and firing on a
synthetic series in `promtool test rules`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vramlab.alerts.rules import AlertRuleSpec, build_rule_groups, duration_s, rule_expr, to_yaml
from vramlab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "oom-drill.yaml"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("VRAMLAB_REQUIRE_PROMTOOL") == "1":
        pytest.fail("VRAMLAB_REQUIRE_PROMTOOL=1 but promtool is not on PATH")
    pytest.skip("promtool not installed (scripts/test installs it)")


def _rule(**kw) -> AlertRuleSpec:
    base = dict(
        name="KV", signal="kv_cache_usage", threshold=0.9, severity="warning", owner="team", action="do x"
    )
    base.update(kw)
    return AlertRuleSpec.model_validate(base)


@pytest.mark.parametrize("missing", ["owner", "action"])
def test_rule_without_owner_or_action_is_refused_as_analysis(missing):
    with pytest.raises(ConfigError, match="analysis, not alerting"):
        build_rule_groups([_rule(**{missing: None})], "vllm", "g")
    with pytest.raises(ConfigError, match="analysis, not alerting"):
        build_rule_groups([_rule(**{missing: "   "})], "vllm", "g")


def test_engine_metric_names_differ_per_engine():
    assert "vllm:" in rule_expr(_rule(), "vllm")
    assert "sglang:token_usage" in rule_expr(_rule(), "sglang")
    assert "llamacpp:kv_cache_usage_ratio" in rule_expr(_rule(), "llama.cpp")
    assert "tgi_queue_size" in rule_expr(_rule(signal="queue_waiting", threshold=50), "tgi")
    # TGI exports no KV-usage gauge: say so instead of inventing a metric
    with pytest.raises(ConfigError, match="unknown signal"):
        rule_expr(_rule(), "tgi")


def test_matchers_and_threshold_land_in_expr():
    expr = rule_expr(_rule(match={"job": 'vl"m'}, op=">=", threshold=0.95), "vllm")
    assert expr.endswith(">= 0.95")
    assert ',job="vl\\"m"' in expr


def test_duration_parsing():
    assert duration_s("1m30s") == 90
    assert duration_s("500ms") == 0.5
    with pytest.raises(ConfigError):
        duration_s("1 minute")


def test_duplicate_names_refused():
    with pytest.raises(ConfigError, match="unique"):
        build_rule_groups([_rule(), _rule()], "vllm", "g")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "llama.cpp"])
def test_every_catalog_signal_passes_promtool_check(tmp_path, engine):
    from vramlab.alerts.rules import signals_for

    promtool = _promtool()
    rules = [
        _rule(name=f"R{i}", signal=sig, threshold=1, for_="1m")
        for i, sig in enumerate(sorted(signals_for(engine)))
    ]
    out = tmp_path / "rules.yml"
    out.write_text(to_yaml(build_rule_groups(rules, engine, f"g-{engine}")))
    res = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout


def test_cli_output_is_promtool_valid_and_fires_in_unit_test(tmp_path):
    promtool = _promtool()
    rules_file = tmp_path / "rules.yml"
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "alerts", str(EXAMPLE), "-o", str(rules_file), "--engine", "vllm"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    check = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    doc = yaml.safe_load(rules_file.read_text())
    for rule in doc["groups"][0]["rules"]:
        assert rule["labels"]["owner"] and rule["annotations"]["action"]

    # KV usage 0.5 for 2 minutes, then 0.95: the 1m-`for` rule is pending at +2m30s and firing
    # from +3m15s; the old V0 metric name must work too (vLLM renamed it).
    tests = {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {
                        "series": 'vllm:kv_cache_usage_perc{instance="a:8000",model_name="m"}',
                        "values": "0.5x8 0.95x20",
                    },
                    {
                        "series": 'vllm:gpu_cache_usage_perc{instance="b:8000",model_name="m"}',
                        "values": "0.1x28",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "2m30s", "alertname": "InferenceKVCacheNearlyFull", "exp_alerts": []},
                    {
                        "eval_time": "4m",
                        "alertname": "InferenceKVCacheNearlyFull",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "owner": "team-inference",
                                    "instance": "a:8000",
                                    "model_name": "m",
                                },
                                "exp_annotations": {
                                    "summary": "KV-cache blocks in use > 0.9 for 1m",
                                    "action": "cap --max-num-seqs at 48 or shorten --max-model-len; see the capacity plan",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    res = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_unit_test_fails_when_series_stays_low(tmp_path):
    """The unit test above can fail: the same expectation on a low series is reported as a failure."""
    promtool = _promtool()
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(to_yaml(build_rule_groups([_rule(name="KVFull", for_="1m")], "vllm", "g")))
    tests = {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": 'vllm:kv_cache_usage_perc{instance="a",model_name="m"}', "values": "0.5x20"}
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "4m",
                        "alertname": "KVFull",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "owner": "team",
                                    "instance": "a",
                                    "model_name": "m",
                                }
                            }
                        ],
                    }
                ],
            }
        ],
    }
    test_file = tmp_path / "t.yml"
    test_file.write_text(yaml.safe_dump(tests))
    res = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)
    assert res.returncode != 0


def test_cli_refuses_plan_with_unowned_alert_in_one_line(tmp_path):
    doc = yaml.safe_load(EXAMPLE.read_text())
    del doc["alerts"][0]["owner"]
    plan = tmp_path / "p.yaml"
    plan.write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "alerts", str(plan)], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "analysis, not alerting" in res.stderr
    assert res.stdout == ""
