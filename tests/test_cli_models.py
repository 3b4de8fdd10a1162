"""`vramlab models` and `vramlab gpus` as a user runs them: the installed command, a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _sources_files import write_sharded_model

VRAMLAB = Path(sys.executable).parent / "vramlab"


def vramlab(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VRAMLAB), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", **(env or {})},
    )


@pytest.fixture(scope="module", autouse=True)
def _installed():
    if not VRAMLAB.exists():
        pytest.fail(f"{VRAMLAB} is missing: install the package (pip install -e .)")


def test_models_json_lists_the_catalog():
    r = vramlab("models", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert len(rows) >= 45
    assert {"name", "hf_id", "aliases", "family", "params_b", "quantization", "source"} <= set(rows[0])
    assert all(row["source"] for row in rows)


def test_models_filters_and_table():
    r = vramlab("models", "--family", "qwen", "--quantized", "--json")
    rows = json.loads(r.stdout)
    assert rows and all(x["family"] == "qwen" and x["quantization"] for x in rows)
    r = vramlab("models", "--no-quantized", "--search", "gemma-3")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "FAMILY", "PARAMS"]
    assert {ln.split()[0] for ln in lines[1:5]} == {
        "gemma-3-1b-it",
        "gemma-3-4b-it",
        "gemma-3-12b-it",
        "gemma-3-27b-it",
    }
    assert "awq" not in r.stdout


def test_models_shows_one_model_and_a_local_directory(tmp_path):
    r = vramlab("models", "meta-llama/Llama-3.1-8B-Instruct", "--json")
    out = json.loads(r.stdout)
    assert out["name"] == "llama-3.1-8b-instruct" and out["spec"]["num_kv_heads"] == 8
    write_sharded_model(tmp_path / "m")
    r = vramlab("models", str(tmp_path / "m"))
    assert r.returncode == 0 and "safetensors headers" in r.stdout


def test_unknown_model_exits_2_with_a_suggestion():
    r = vramlab("models", "llama-3.1-8b-instrut")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("vramlab models: error: unknown model")
    assert "did you mean 'llama-3.1-8b-instruct'" in r.stderr and "Traceback" not in r.stderr
    r = vramlab("models", "acme/not-in-catalog", env={"HF_HUB_OFFLINE": ""})
    # `models` has --online, not plan's --offline: the hint names the switch this command has
    assert r.returncode == 2 and "pass --online" in r.stderr and "--offline" not in r.stderr
    r = vramlab("models", "--family", "nope")
    assert r.returncode == 2 and "families:" in r.stderr


def test_gpus_table_and_json():
    r = vramlab("gpus")
    assert r.returncode == 0
    h100 = next(ln for ln in r.stdout.splitlines() if ln.startswith("h100-80gb "))
    assert h100.split()[1] == "discrete" and h100.split()[4:8] == ["79.19", "80", "3350", "989"]
    rows = json.loads(vramlab("gpus", "--json").stdout)
    t4 = next(g for g in rows if g["name"] == "t4")
    assert t4["memory_gib"] == 14.74 and t4["memory_bytes"] == int(14.74 * 2**30) and t4["nominal_gb"] == 16
