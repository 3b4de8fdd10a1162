"""`vramlab pack` as a user runs it (subprocess, the installed command) and its input errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vramlab.errors import ConfigError
from vramlab.placement.inputs import load_fleet, load_models

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
VRAMLAB = str(Path(sys.executable).parent / "vramlab")


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([VRAMLAB, "pack", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_examples_table() -> None:
    p = run(str(EX / "fleet.yaml"), str(EX / "models.yaml"))
    assert p.returncode == 0, p.stderr
    assert "start order" in p.stdout and "--gpu-memory-utilization" in p.stdout
    assert "--mem-fraction-static" in p.stdout  # the SGLang instance
    assert "on-demand" in p.stdout


def test_examples_json_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "map.png"
    p = run(
        str(EX / "fleet.yaml"),
        str(EX / "models.yaml"),
        "--json",
        "--plot",
        str(png),
        "--simulate",
        str(EX / "trace.jsonl"),
        "--policy",
        "sleep-1",
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "vramlab.pack/1" and doc["feasible"] is True
    for card in doc["cards"]:
        assert card["resident_used_bytes"] + card["resident_margin_bytes"] <= card["memory_bytes"]
        assert card["vllm_utilization_sum"] <= 1.0
    starts = sorted(i["start_order"] for i in doc["instances"] if i["residency"] == "resident")
    assert starts == list(range(1, len(starts) + 1))
    sim = doc["simulation"]
    assert sim["policy"] == "sleep-1" and sim["requests"] == sum(1 for _ in open(EX / "trace.jsonl"))
    assert sum(m["wakes"] for m in sim["models"]) > 0  # on-demand models share a card and sleep
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_simulation_is_deterministic_across_runs() -> None:
    args = (str(EX / "fleet.yaml"), str(EX / "models.yaml"), "--json", "--simulate", str(EX / "trace.jsonl"))
    a, b = run(*args), run(*args)
    assert a.returncode == 0 and a.stdout == b.stdout


def test_infeasible_fleet_exits_1_and_says_what_would_fit(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text("gpu: l4\n")
    p = run(str(tmp_path / "fleet.yaml"), str(EX / "models.yaml"))
    assert p.returncode == 1
    assert "does not fit" in p.stdout and "smallest changes" in p.stdout


def test_bad_models_file_is_one_line_with_the_line_number(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("models:\n  - model: qwen2.5-7b-instruct\n    concurency: 4\n")
    p = run(str(EX / "fleet.yaml"), str(tmp_path / "m.yaml"))
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "m.yaml:3:" in lines[0] and "concurency" in lines[0]


def test_unknown_catalog_model_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("models:\n  - model: llama-9-8b\n")
    p = run(str(EX / "fleet.yaml"), str(tmp_path / "m.yaml"))
    assert p.returncode == 2 and "Traceback" not in p.stderr and "llama-9-8b" in p.stderr


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("models:\n  - model: a\n    engine: vlm\n", ":3: models[0].engine: unknown engine 'vlm'"),
        ("models:\n  - model: a\n    tp: 3\n", ":3: models[0].tp"),
        (
            "models:\n  - model: a\n    settings:\n      kv_cache_dtyp: fp8\n",
            ":3: models[0].settings: unknown engine setting 'kv_cache_dtyp'; did you mean 'kv_cache_dtype'",
        ),
        ("models:\n  - model: a\n    settings: {max_model_len: 10}\n", "set by pack"),
        ("models:\n  - model: a\n  - model: a\n", ":3: instance name 'a' is used twice"),
        ("policy: {eviction: fifo}\nmodels:\n  - model: a\n", ":1: policy.eviction: unknown eviction policy"),
        ("models: [\n", "not valid YAML"),
        ("", "the file is empty"),
    ],
)
def test_models_errors(tmp_path: Path, text: str, where: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_models(f)
    assert where in str(exc.value)


def test_models_defaults_fill_every_model(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(
        "defaults: {engine: sglang, priority: 3}\nmodels:\n  - model: a\n  - {model: b, priority: 9}\n"
    )
    insts, policy = load_models(f)
    assert [(i.engine, i.priority) for i in insts] == [("sglang", 3), ("sglang", 9)]
    assert policy.eviction == "lru" and policy.keep_alive_s == 300


def test_fleet_forms_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "f.yaml"
    f.write_text("gpu: H100\ncount: 2\n")
    fl = load_fleet(f)
    assert [c.label for c in fl.cards] == ["node0/gpu0", "node0/gpu1"] and fl.cards[0].gpu_name == "h100-80gb"
    f.write_text("nodes:\n  - name: a\n    gpu: l4\n  - name: b\n    gpu: h10\n")
    with pytest.raises(ConfigError, match=r"f.yaml:5: .*did you mean"):
        load_fleet(f)
    f.write_text("nodes:\n  - {gpu: l4, count: 0}\n")
    with pytest.raises(ConfigError, match=r"f.yaml:2: nodes\[0\]\.count"):
        load_fleet(f)
