"""Bad numbers are refused at the edge with the field's name, plan time is linear in
layers and bounded, and the calibration bookkeeping holds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _narrow import some
from capacity_models import LLAMA_31_8B, spec
from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.calibration import FIT_TARGETS, profile_from_dict
from vramlab.capacity.constants import _DEFAULTS, fixed_names, names
from vramlab.capacity.validation import MAX_LAYERS
from vramlab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
H100 = get_gpu("h100-80gb")


@pytest.mark.parametrize(
    "change,fragment",
    [
        ({"hidden_size": -0.5}, "'hidden_size' must be a whole number, got -0.5"),
        ({"num_hidden_layers": True}, "'num_hidden_layers' must be a whole number, got True"),
        ({"num_attention_heads": 0}, "'num_attention_heads' must be at least 1, got 0"),
        ({"vocab_size": "32000"}, "'vocab_size' must be a whole number, got '32000'"),
        ({"intermediate_size": [1, 2]}, "'intermediate_size' must be a whole number"),
        ({"max_position_embeddings": float("inf")}, "'max_position_embeddings' must be finite"),
        ({"num_key_value_heads": float("nan")}, "'num_key_value_heads' must be finite"),
        ({"num_hidden_layers": 100_000}, f"'num_hidden_layers' must be at most {MAX_LAYERS}"),
    ],
)
def test_bad_config_numbers_are_refused_with_the_field(change, fragment):
    with pytest.raises(ConfigError) as exc:
        spec({**LLAMA_31_8B, **change})
    assert fragment in str(exc.value)


def test_whole_floats_in_configs_are_accepted():
    assert spec({**LLAMA_31_8B, "max_position_embeddings": 131072.0}).max_position_embeddings == 131072


@pytest.mark.parametrize(
    "change,flag",
    [
        ({"gpu_memory_utilization": 0.0}, "--gpu-memory-utilization"),
        ({"gpu_memory_utilization": float("nan")}, "--gpu-memory-utilization"),
        ({"max_model_len": 0}, "--max-model-len"),
        ({"max_num_seqs": 0}, "--max-num-seqs"),
        ({"block_size": 0}, "--block-size"),
        ({"max_num_batched_tokens": -1}, "--max-num-batched-tokens"),
        ({"tensor_parallel_size": 0}, "--tensor-parallel-size"),
        ({"engine_version": "banana"}, "--engine-version"),
        ({"ctx_size": -5, "engine": "llama.cpp"}, "--ctx-size"),
        ({"mem_fraction_static": 1.5, "engine": "sglang"}, "--mem-fraction-static"),
    ],
)
def test_bad_settings_are_refused_by_every_entry_point(change, flag):
    # estimate() itself checks, so sweeps, calibration and pack cannot slip a 0 through.
    with pytest.raises(ConfigError, match=re.escape(flag) + ":"):
        estimate(spec(LLAMA_31_8B), H100, EngineSettings(**change))


def test_a_reversed_version_range_in_a_profile_is_refused():
    data = {
        "format": 1,
        "section": [{"engine": "vllm", "version_min": "0.19.0", "version_max": "0.8.0", "constants": {}}],
    }
    with pytest.raises(ConfigError, match="reversed"):
        profile_from_dict(data, "p.toml")


def test_cli_on_a_bad_config_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**LLAMA_31_8B, "num_hidden_layers": True}))
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "plan", "--model", str(bad), "--gpu", "h100"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "num_hidden_layers" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _best_time(config: dict, runs: int = 3) -> float:
    m = spec(config)
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        estimate(m, H100, EngineSettings(engine_version="0.19.0", max_model_len=2048), with_suggestions=False)
        best = min(best, time.perf_counter() - t0)
    return best


def test_plan_time_is_linear_in_layers_up_to_the_bound():
    small = {
        **LLAMA_31_8B,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    }
    t_small = _best_time({**small, "num_hidden_layers": 256})
    t_big = _best_time({**small, "num_hidden_layers": MAX_LAYERS})
    # 16x the layers: linear is ~16x; the quadratic kinds lookup it replaced was 256x. Generous for a busy box.
    assert t_big < 10.0
    assert t_big < 80 * max(t_small, 1e-3)


# --- calibration bookkeeping ---------------------------------------------------------------------


def test_every_constant_is_fittable_or_marked_fixed():
    fittable = set(FIT_TARGETS)
    for name in names():
        assert (name in fittable) != bool(_DEFAULTS[name].fixed), name
    assert set(fixed_names()) == {n for n in names() if n not in fittable}


def test_the_fit_list_names_only_constants_that_exist():
    assert set(FIT_TARGETS) <= set(names())


def test_every_constant_is_used_by_a_policy():
    src = "\n".join(
        p.read_text()
        for p in (ROOT / "src" / "vramlab" / "capacity").rglob("*.py")
        if p.name not in ("constants.py", "calibration.py")
    )
    unused = [n for n in names() if f'"{n}"' not in src]
    assert not unused, unused


# --- the capacity policies stay readable -----------------------------------------


# Capacity functions over 60 lines since `ruff format` laid them out, each capped at that size: it may
# shrink (and must leave this list once at 60 or under) but not grow. To be split by concept.
CAPACITY_LONG = {
    "calibration.py:fit": 83,
    "llamacpp.py:layout": 84,
    "sglang.py:plan": 89,
    "tgi.py:plan": 90,
    "transformers.py:plan": 70,
    "vllm.py:plan": 72,
    "model.py:estimate": 71,
    "run_calibration.py:calibrate_runs": 69,
}


def test_capacity_functions_are_short_and_names_say_what_they_hold():
    import ast

    long, cryptic, seen = [], [], {}
    for path in (ROOT / "src" / "vramlab" / "capacity").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name, n = f"{path.name}:{node.name}", some(node.end_lineno) - node.lineno + 1
                seen[name] = n
                if n > CAPACITY_LONG.get(name, 60):
                    long.append(f"{name} ({n} lines)")
            if isinstance(node, ast.Name) and node.id in ("mbt", "bpr", "lays"):
                cryptic.append(f"{path.name}:{node.id}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("s", "c")
                and getattr(node.value, "id", "") == "ctx"
            ):
                cryptic.append(f"{path.name}:ctx.{node.attr}")
    assert not long, long
    assert not cryptic, cryptic
    assert not [f for f in CAPACITY_LONG if seen.get(f, 0) <= 60], "capped entry now short: drop it"
