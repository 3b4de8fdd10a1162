"""`vramlab plan` with a draft, a host KV tier and a release comparison, as a user runs it (the installed command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_capacity_speculative import EAGLE3_HEAD, EAGLE3_HEAD_BYTES
from test_cli_plan import vramlab

LLAMA = ("plan", "--model", "llama-3.1-8b-instruct", "--gpu", "h100-80gb", "--max-model-len", "8192")


@pytest.fixture
def head(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3_HEAD))
    return str(tmp_path)


def one_line_error(r) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--speculative-config", '{"method": eagle3}'), "--speculative-config: not JSON"),
        (("--speculative-config", '["eagle3"]'), "expected a JSON object"),
        (("--speculative-config", '{"method": "medusa2"}'), "method 'medusa2'"),
        (
            ("--speculative-config", '{"method": "eagle", "model": "x"}'),
            '"num_speculative_tokens" is required',
        ),
        (
            ("--engine", "sglang", "--speculative-config", '{"method": "ngram"}'),
            "vLLM flags; add --engine vllm",
        ),
        (("--speculative-algorithm", "EAGLE"), "SGLang flags"),
        (("--engine", "sglang", "--speculative-algorithm", "EAGLE3"), "add --speculative-draft-model-path"),
        (("--kv-transfer-config", "{oops"), "--kv-transfer-config: not JSON"),
        (("--kv-transfer-config", '{"kv_connector": "NixlConnector"}'), "not a host KV tier"),
        (("--kv-offloading-size", "-4"), "--kv-offloading-size: a positive number"),
        (("--engine", "sglang", "--hicache-ratio", "3"), "add --enable-hierarchical-cache"),
        (("--speculative-num-steps", "3", "--engine", "sglang"), "name the speculative method first"),
    ],
)
def test_bad_speculative_and_offload_flags_are_one_line_exit_2(flags, says):
    assert says in one_line_error(vramlab(*LLAMA, *flags))


def test_vllm_eagle3_head_in_the_json_and_the_text(head):
    r = vramlab(
        *LLAMA, "--speculative-config", json.dumps({"model": head, "num_speculative_tokens": 3}), "--json"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    draft = out["speculative"]
    assert draft["method"] == "eagle3"  # detected from the path, as vLLM detects it from the name
    assert draft["draft_weights_bytes"] == EAGLE3_HEAD_BYTES and draft["draft_kv_in_pool"]
    assert any(c["name"] == "draft_weights" and c["in_budget"] for c in out["components"])
    text = vramlab(
        *LLAMA,
        "--speculative-config",
        json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": 3}),
    )
    assert "speculative decoding (eagle3" in text.stdout and "draft_weights" in text.stdout


def test_sglang_and_llamacpp_drafts_from_their_own_flags(head):
    sg = vramlab(
        *LLAMA,
        "--engine",
        "sglang",
        "--engine-version",
        "0.5.6",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        head,
        "--json",
    )
    assert sg.returncode == 0, sg.stderr
    out = json.loads(sg.stdout)
    assert out["settings"]["mem_fraction_static"] == 0.809 and out["speculative"]["extra_slots"] == 1444
    cpp = vramlab(
        "plan",
        "--model",
        "qwen3-8b",
        "--gpu",
        "rtx-4090",
        "--engine",
        "llama.cpp",
        "--quantization",
        "Q4_K_M",
        "-c",
        "16k",
        "-md",
        "qwen3-0.6b",
        "-ngld",
        "all",
        "--draft-max",
        "8",
    )
    assert cpp.returncode == 0, cpp.stderr
    assert "draft_kv" in cpp.stdout and "draft_compute" in cpp.stdout and "include the draft's" in cpp.stdout


def test_host_tiers_in_the_json():
    vllm = json.loads(vramlab(*LLAMA, "-tp", "2", "--kv-offloading-size", "100", "--json").stdout)
    assert (
        vllm["kv_offload"]["host_bytes_per_gpu"] == 50 << 30 and vllm["kv_offload"]["host_tokens"] == 819_200
    )
    r = vramlab(*LLAMA, "--engine", "sglang", "--enable-hierarchical-cache", "--host-memory-gib", "64")
    assert r.returncode == 1 and "KV offload (HiCache)" in r.stdout and "keep 10 GiB free" in r.stdout


def test_release_comparison_text_json_and_sweep():
    text = vramlab(*LLAMA, "--engine-version", "0.19.0", "--vs-engine-version", "0.20.0")
    assert text.returncode == 0, text.stderr
    assert "UTIL_092_FROM" in text.stdout and "gpu_memory_utilization defaults to 0.92" in text.stdout
    out = json.loads(vramlab(*LLAMA, "--engine-version", "0.19.0", "--vs", "0.20.0", "--json").stdout)
    assert {r["rule"] for r in out["rules_crossed"]} == {"UTIL_092_FROM", "GRAPH_ESTIMATE_FROM"}
    assert out["a"]["engine_version"] == "0.19.0" and out["b"]["engine_version"] == "0.20.0"
    same = vramlab(*LLAMA, "--engine-version", "0.25.1", "--vs", "0.26.0")
    assert "the plans are the same" in same.stdout and "no release rule vramlab models" in same.stdout
    grid = vramlab(*LLAMA, "--sweep", "engine-version=0.19.0,0.20.0")
    assert "release rules vs the release before" in grid.stdout and "UTIL_092_FROM" in grid.stdout
    assert "--sweep engine-version" in one_line_error(
        vramlab(*LLAMA, "--vs", "0.20.0", "--sweep", "max-num-seqs=8,16")
    )
    assert "--engine-version" in one_line_error(vramlab(*LLAMA, "--vs", "zero"))
