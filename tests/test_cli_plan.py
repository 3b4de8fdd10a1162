"""`vramlab plan` as a user runs it: the installed command in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VRAMLAB = shutil.which("vramlab", path=str(Path(sys.executable).parent)) or "vramlab"
CONTRACT = (
    "weights_bytes",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "kv_bytes_per_token",
    "activation_peak_bytes",
    "non_torch_bytes",
    "cuda_graph_bytes",
    "max_concurrency",
    "max_model_len",
    "fits",
    "headroom_bytes",
    "components",
)


def vramlab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([VRAMLAB, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def test_plan_prints_every_component_and_a_verdict():
    r = vramlab("plan", "--model", "llama-3.1-8b-instruct", "--gpu", "h100-80gb", "--max-model-len", "8192")
    assert r.returncode == 0, r.stderr
    for name in (
        "weights",
        "kv_cache",
        "activation_peak",
        "non_torch",
        "cuda_graphs",
        "cuda_context",
        "headroom",
    ):
        assert name in r.stdout
    assert "verdict: FITS" in r.stdout
    assert "safe operating point (10% margin" in r.stdout


def test_plan_json_contract():
    r = vramlab(
        "plan",
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu",
        "h100",
        "--json",
        "--gpu-memory-utilization",
        "0.9",
        "--concurrency",
        "32",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    for key in CONTRACT:
        assert key in j, key
    for key in CONTRACT:
        if key.endswith("_bytes") or key in ("kv_cache_tokens", "max_model_len"):
            assert isinstance(j[key], int), key
    assert {c["provenance"] for c in j["components"]} <= {
        "exact",
        "formula",
        "engine-policy",
        "default",
        "calibrated",
    }
    for c in j["components"]:
        assert c["low_bytes"] <= c["bytes"] <= c["high_bytes"]
    assert j["max_model_len_at_concurrency"] > 8192
    assert j["settings"]["gpu_memory_utilization"] == 0.9


@pytest.mark.parametrize(
    "engine,extra",
    [
        ("sglang", ["-tp", "2"]),
        ("tgi", []),
        ("llama.cpp", ["--ctx-size", "32k", "--parallel", "4"]),
        ("transformers", ["--max-num-seqs", "4", "--max-model-len", "4096"]),
    ],
)
def test_plan_other_engines(engine, extra):
    r = vramlab(
        "plan", "--model", "qwen2.5-7b-instruct", "--gpu", "a100-80gb", "--engine", engine, "--json", *extra
    )
    assert r.returncode in (0, 1, 3), r.stderr
    j = json.loads(r.stdout)
    assert j["engine"] == engine and j["kv_cache_bytes"] > 0


def test_does_not_fit_exits_1_with_checked_suggestions():
    r = vramlab("plan", "--model", "llama-3.1-8b-instruct", "--gpu", "l4", "--max-model-len", "128k")
    assert r.returncode == 1
    assert "DOES NOT FIT" in r.stdout and "try: lower --max-model-len to" in r.stdout
    line = r.stdout.split("try: lower --max-model-len to ")[1].splitlines()[0]
    length = int(line.split()[0])
    safe = int(line.split("; ")[1].split()[0].replace(",", ""))
    assert safe < length
    ok = vramlab("plan", "--model", "llama-3.1-8b-instruct", "--gpu", "l4", "--max-model-len", str(length))
    assert ok.returncode == 3 and "verdict: AT RISK" in ok.stdout, ok.stdout  # fits at the estimate only
    sure = vramlab("plan", "--model", "llama-3.1-8b-instruct", "--gpu", "l4", "--max-model-len", str(safe))
    assert sure.returncode == 0 and "verdict: FITS" in sure.stdout, sure.stdout


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--model", "llama-3.1-8b-instruc", "--gpu", "h100"], "did you mean 'llama-3.1-8b-instruct'"),
        (["--model", "llama-3.1-8b-instruct", "--gpu", "h101"], "unknown GPU 'h101'"),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--gpu-memory-utilization", "1.5"],
            "at most 1",
        ),
        # 0 is never "not set", NaN/inf never a number: each refused with the flag's name.
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--gpu-memory-utilization", "0"],
            "--gpu-memory-utilization: must be greater than 0",
        ),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--gpu-memory-utilization", "nan"],
            "--gpu-memory-utilization: must be finite",
        ),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--gpu-memory-utilization", "inf"],
            "--gpu-memory-utilization: must be finite",
        ),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--max-model-len", "0"],
            "--max-model-len: must be at least 1",
        ),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--max-num-seqs", "0"],
            "--max-num-seqs: must be at least 1",
        ),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--block-size", "0"],
            "--block-size: must be at least 1",
        ),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--kv-cache-memory", "0"],
            "--kv-cache-memory: must be",
        ),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "-tp", "0"],
            "--tensor-parallel-size: must be at least 1",
        ),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--engine-version", "banana"],
            "--engine-version: not a release number",
        ),
        (["--model", "llama-3.1-8b-instruct", "--gpu-memory-gib", "nan"], "--gpu-memory-gib"),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--other-processes-gib", "-1"],
            "--other-processes-gib",
        ),
        (["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--concurrency", "0"], "--concurrency"),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--sweep", "max-model-len=0,8k"],
            "--max-model-len",
        ),
        (["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "-tp", "3"], "divisible"),
        (["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--max-model-len", "1m"], "greater than"),
        (["--model", "llama-3.1-8b-instruct", "--gpu", "h100", "--sweep", "foo=1"], "unknown key"),
        (["--model", "llama-3.1-8b-instruct"], "--gpu"),
        (["--model", "/no/such/dir", "--gpu", "h100"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    r = vramlab("plan", *args)
    assert r.returncode == 2
    assert fragment in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_config_json_and_directory(tmp_path):
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 28,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for target in (tmp_path, tmp_path / "config.json"):
        r = vramlab("plan", "--model", str(target), "--gpu", "l4", "--json", "--max-model-len", "8k")
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert j["kv_bytes_per_token"] == 28 * 8 * 128 * 2 * 2
    bad = dict(cfg)
    del bad["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(bad))
    r = vramlab("plan", "--model", str(tmp_path), "--gpu", "l4")
    assert r.returncode == 2 and "num_hidden_layers" in r.stderr


def test_sweep_grid_and_plot(tmp_path):
    png = tmp_path / "grid.png"
    r = vramlab(
        "plan",
        "--model",
        "qwen3-8b",
        "--gpu",
        "l4",
        "--sweep",
        "max-model-len=2k,8k,32k",
        "--sweep",
        "max-num-seqs=16,64",
        "--plot",
        str(png),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert len(j["rows"]) == 6
    conc = {
        (row["max_model_len"], row["max_num_seqs"]): row["max_concurrency"]
        for row in j["rows"]
        if row["fits"]
    }
    assert conc[(2048, 16)] > conc[(8192, 16)]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_is_fast_and_lists_every_command():
    r = vramlab("--help")
    assert r.returncode == 0
    for cmd in ("plan", "models", "gpus"):
        assert f"  {cmd}" in r.stdout


def test_gguf_file_weights_are_exact_for_llamacpp(tmp_path):
    from _sources_files import write_gguf

    path = tmp_path / "tiny.gguf"
    write_gguf(path, layers=2, kv=2, quant_type="Q8_0")
    from vramlab.sources import resolve_model

    spec = resolve_model(str(path))
    r = vramlab(
        "plan",
        "--model",
        str(path),
        "--gpu",
        "rtx-4090",
        "--engine",
        "llama.cpp",
        "--ctx-size",
        "4096",
        "--parallel",
        "2",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    weights = next(c for c in j["components"] if c["name"] == "weights")
    assert weights["provenance"] == "exact"
    assert weights["bytes"] == spec.weights_bytes_exact
    # 2 layers x 2 KV heads x 64 x (K + V) x f16 x 4096 cells.
    assert j["kv_cache_bytes"] == 2 * 2 * 64 * 2 * 2 * 4096
    assert j["max_concurrency"] == 2 and j["max_model_len"] == 2048


def test_in_trainer_says_the_band_is_widened_and_uses_the_llm_class_defaults():
    r = vramlab(
        "plan",
        "--model",
        "llama-3.1-8b-instruct",
        "--gpu",
        "a100-80gb",
        "--engine-version",
        "0.8.5",
        "--vllm-engine",
        "v0",
        "--in-trainer",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert any("training process" in n for n in out["notes"])


def test_plan_counts_vllm_lora_slots_and_refuses_a_bad_rank():
    base = ("plan", "--model", "qwen3-8b", "--gpu", "l4", "--max-model-len", "2048", "--json")
    plain = json.loads(vramlab(*base).stdout)
    r = vramlab(*base, "--enable-lora", "--max-lora-rank", "32")
    assert r.returncode == 0, r.stderr
    lora = json.loads(r.stdout)
    # Qwen3-8B at rank 32: ~0.16 GiB of A/B buffers (vllm/lora/layers/base_linear.py), weights grow by that
    assert 0.14 < (lora["weights_bytes"] - plain["weights_bytes"]) / 2**30 < 0.18
    bad = vramlab(*base, "--enable-lora", "--max-lora-rank", "0")
    assert bad.returncode == 2 and "--max-lora-rank" in bad.stderr and "Traceback" not in bad.stderr


def test_transformers_at_concurrency_4_names_serial_serving_not_memory():
    import subprocess
    import sys

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "plan",
            "--model",
            "qwen2.5-0.5b-instruct",
            "--engine",
            "transformers",
            "--concurrency",
            "4",
            "--gpu",
            "l4",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("largest max_model_len for 4"))
    assert "none fits" not in line and "one request at a time" in line and "not for lack of memory" in line
    assert "4 sequences up to 0 tokens" not in res.stdout and "verdict: FITS" in res.stdout
    batched = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "plan",
            "--model",
            "qwen2.5-0.5b-instruct",
            "--engine",
            "transformers",
            "--concurrency",
            "4",
            "--gpu",
            "l4",
            "--continuous-batching",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if batched.returncode == 0:  # with continuous batching the memory is the limit again
        assert "one request at a time" not in batched.stdout
