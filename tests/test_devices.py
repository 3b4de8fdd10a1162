"""Planning targets other than a whole discrete card, as a user reaches them: `vramlab gpus` and `vramlab plan`
run as the installed command. Every expected figure is derived by hand in the comment beside it from the
catalog's sourced inputs (capacity/gpu_catalog.py, gpu_unified.py, gpu_mig.py), not recomputed by the code."""

from __future__ import annotations

import json

import pytest

from test_cli_models import vramlab

GIB = 1 << 30


@pytest.fixture(scope="module")
def targets() -> dict[str, dict]:
    r = vramlab("gpus", "--json")
    assert r.returncode == 0, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


def plan(*args: str) -> tuple[int, dict]:
    r = vramlab("plan", "--offline", "--json", *args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_the_catalog_lists_the_new_cards_with_usable_memory_and_a_source(targets):
    expected = {
        "rtx-3060": 11.63,  # observed: vLLM's error line on a desktop RTX 3060 12GB (r244)
        "rtx-4060": 7.63,  # 8192 MiB - 379 MiB (the RTX 4090's 24576 - 24197) = 7813 MiB
        "rtx-4060-ti-16gb": 15.63,  # 16384 - 379 = 16005 MiB
        "rtx-4070": 11.63,  # 12288 - 379 = 11909 MiB
        "rtx-5060-ti-16gb": 15.35,  # 16384 - 662 (the RTX 5090's 32768 - 32106) = 15722 MiB
        "rtx-5080": 15.35,
        "rtx-4090-laptop": 15.63,
        "rtx-3060-laptop": 5.63,  # 6144 - 379 (the RTX 3060 12GB's 12288 - 11909) = 5765 MiB
        "rtx-pro-6000": 95.01,  # observed: vLLM total_gpu_memory, r110-r112
        "h20": 95.12,  # nvidia-smi 97871 MiB - 468 (the H100's 81559 - 81091) = 97403 MiB
        "b300": 267.89,  # nvidia-smi 275040 MiB - 718 (the B200's 183359 - 182641) = 274322 MiB
        "gb200": 184.33,  # 189471 - 718 = 188753 MiB
        "mi355x": 287.98,
    }
    for name, gib in expected.items():
        row = targets[name]
        assert row["memory_gib"] == gib, name
        assert row["kind"] == "discrete" and row["memory_source"], name
        assert row["memory_gib"] < row["nominal_gb"], name  # usable is less than the marketing figure
    assert targets["l40s"]["memory_gib"] == 44.39  # "48 GB" as the engines read it
    assert all(row["memory_source"] for row in targets.values())


def test_mig_slices_have_less_memory_than_their_card(targets):
    slices = {n: r for n, r in targets.items() if r["kind"] == "mig"}
    assert {r["parent"] for r in slices.values()} == {"a100-40gb", "a100-80gb", "h100-80gb", "h200", "b200"}
    # `nvidia-smi mig -lgip` memory, GiB (capacity/gpu_mig.py names each output)
    assert slices["h100-80gb:3g.40gb"]["memory_gib"] == 39.50
    assert slices["a100-80gb:1g.10gb"]["memory_gib"] == 9.50
    assert slices["a100-40gb:3g.20gb"]["memory_gib"] == 19.62
    assert slices["h200:1g.18gb"]["memory_gib"] == 16.00
    for name, row in slices.items():
        card = targets[row["parent"]]
        if not name.split(":")[1].startswith("7g."):
            assert row["memory_gib"] < card["memory_gib"], name  # a partial slice: less than the whole card
        assert row["memory_gib"] < card["nominal_gb"], name


def test_unified_machines_and_apple_working_sets(targets):
    spark = targets["dgx-spark"]
    assert spark["kind"] == "unified" and spark["memory_gib"] == 121.69 and spark["os_reserved_gib"] == 8.48
    # Metal's recommendedMaxWorkingSetSize as llama.cpp prints it: 2/3 of 32 GB = 22906.50 MB = 21.33 GiB,
    # 3/4 of 36 GB = 28991.03 MB = 27.00 GiB, 3/4 of 128 GB = 103079.22 MB = 96.00 GiB
    assert targets["apple-m2-max-32gb"]["memory_gib"] == 21.33
    assert targets["apple-m3-max-36gb"]["memory_gib"] == 27.0
    assert targets["apple-m4-max-128gb"]["memory_gib"] == 96.0
    assert targets["apple-m2-ultra-192gb"]["engines"] == ["llama.cpp", "ollama"]
    assert targets["strix-halo-64g"]["memory_gib"] == 64.0  # ROCm's total with a 64 GB carve-out (r262)


def test_gpus_filters_by_kind():
    r = vramlab("gpus", "--kind", "unified")
    assert r.returncode == 0
    lines = [ln for ln in r.stdout.splitlines()[1:] if ln and not ln.startswith("MEMORY")]
    assert lines and all(ln.split()[1] == "unified" for ln in lines if ln.strip())
    assert vramlab("gpus", "--kind", "nope").returncode == 2


def test_a_mig_slice_plans_on_its_own_memory_with_the_whole_cards_defaults():
    _, e = plan("--model", "qwen3-8b", "--gpu", "h100-80gb:3g.40gb", "--max-model-len", "8192")
    assert e["gpu"] == "h100-80gb:3g.40gb"
    assert e["gpu_memory_bytes"] == int(39.5 * GIB)
    assert abs(e["budget_bytes"] - 0.92 * 39.5 * GIB) < 2  # vLLM 0.29's default 0.92 x the slice
    # vLLM's defaults read NVML by index: the whole H100 (79.19 GiB >= 70, not an A100) -> 1024 / 8192
    assert (e["settings"]["max_num_seqs"], e["settings"]["max_num_batched_tokens"]) == (1024, 8192)
    assert e["device"]["kind"] == "mig" and e["device"]["parent"] == "h100-80gb"
    assert any("no CUDA IPC between MIG instances" in n for n in e["notes"])
    # the same slice of an A100: vLLM excludes A100s from the large defaults -> 256 / 2048
    _, a = plan("--model", "qwen3-8b", "--gpu", "a100-80gb-mig-3g.40gb", "--max-model-len", "8192")
    assert a["gpu_memory_bytes"] == int(39.25 * GIB)
    assert (a["settings"]["max_num_seqs"], a["settings"]["max_num_batched_tokens"]) == (256, 2048)
    r = vramlab("plan", "--offline", "--model", "qwen3-8b", "--gpu", "h100:5g.50gb")
    assert r.returncode == 2 and "no MIG profile '5g.50gb'" in r.stderr and "Traceback" not in r.stderr


def test_a_dgx_spark_plans_the_oss_share_and_warns_about_vllms_profile():
    _, e = plan("--model", "llama-3.1-8b-instruct", "--gpu", "dgx-spark", "--max-model-len", "32k")
    assert e["device"]["held_before_start_bytes"] == int(8.48 * GIB)
    # NVML cannot report unified memory: vLLM's small-card defaults
    assert (e["settings"]["max_num_seqs"], e["settings"]["max_num_batched_tokens"]) == (256, 2048)
    notes = " ".join(e["notes"])
    # util x total = 0.92 x 121.69 = 111.95 GiB, leaving 121.69 - 111.95 = 9.74 GiB for the OS
    assert "util x total = 111.95 GiB leaves 9.74 GiB" in notes
    assert "vllm-project/vllm#46307" in notes and "vllm-project/vllm#48140" in notes
    # vLLM reads its non-torch memory off cudaMemGetInfo, MemFree there: page cache the loader reads in (up to the
    # checkpoint, 14.96 GiB of bf16 Llama-3.1-8B) can come off the pool, so the band's low end reaches that far
    comps = {c["name"]: c for c in e["components"]}
    assert (
        comps["non_torch"]["high_bytes"] - comps["non_torch"]["bytes"]
        >= comps["weights"]["bytes"]
        > 14.9 * GIB
    )
    _, card = plan("--model", "llama-3.1-8b-instruct", "--gpu", "h100-80gb", "--max-model-len", "32k")
    assert next(c for c in card["components"] if c["name"] == "non_torch")["high_bytes"] < 1 * GIB
    # at 0.95 the start-up check refuses: free = 121.69 - 8.48 (OS) - 0.51 (CUDA context) = 112.70 GiB
    # against 0.95 x 121.69 = 115.61 GiB
    rc, r = plan(
        "--model", "llama-3.1-8b-instruct", "--gpu", "dgx-spark", "--max-model-len", "32k",
        "--gpu-memory-utilization", "0.95",
    )  # fmt: skip
    assert rc == 1 and any("Free memory on device (112.70/121.69 GiB)" in x for x in r["reasons"])
    # the OS's share given explicitly replaces the catalog's
    _, o = plan(
        "--model", "llama-3.1-8b-instruct", "--gpu", "dgx-spark", "--max-model-len", "32k",
        "--other-processes-gib", "4",
    )  # fmt: skip
    assert o["device"]["held_before_start_bytes"] == 4 * GIB


def test_metal_runs_llama_cpp_and_ollama_only():
    r = vramlab("plan", "--offline", "--model", "qwen3-8b", "--gpu", "apple-m3-max-64gb")
    assert r.returncode == 2 and "vllm does not run on apple-m3-max-64gb" in r.stderr
    _, e = plan(
        "--model", "qwen3-8b", "--gpu", "apple-m3-max-64gb", "--engine", "llama.cpp",
        "--quantization", "Q4_K_M", "-c", "32k",
    )  # fmt: skip
    assert e["gpu_memory_bytes"] == int(48.0 * GIB)  # 3/4 of 64 GB
    assert any("iogpu.wired_limit_mb" in n for n in e["notes"])


def test_a_hami_cap_is_the_total_vllm_takes_its_share_of():
    _, e = plan(
        "--model", "qwen3-8b", "--gpu", "h100-80gb", "--gpu-memory-limit-gib", "40", "--max-model-len", "8192"
    )  # fmt: skip
    assert e["gpu_memory_bytes"] == 40 * GIB
    assert abs(e["budget_bytes"] - 0.92 * 40 * GIB) < 2  # 36.80 GiB: a share of the cap
    assert e["settings"]["max_num_seqs"] == 1024  # NVML still reports the whole H100
    assert any("vllm-project/vllm#40937" in n for n in e["notes"])
    r = vramlab("plan", "--offline", "--model", "qwen3-8b", "--gpu", "l4", "--gpu-memory-limit-gib", "30")
    assert r.returncode == 2 and "at most the card's 22.49 GiB" in r.stderr


def test_an_mps_limit_refuses_a_budget_above_it_and_suggests_the_utilization_that_fits():
    rc, e = plan(
        "--model", "qwen3-8b", "--gpu", "l40s", "--mps-memory-limit-gib", "20", "--max-model-len", "8192"
    )  # fmt: skip
    assert rc == 1 and any("above the MPS limit of 20.00 GiB" in x for x in e["reasons"])
    # (20 - 0.51 GiB of CUDA context outside the budget) / 44.39 GiB = 0.439 -> 0.43
    assert "lower --gpu-memory-utilization to 0.43 (under the MPS limit)" in e["suggestions"]
    rc, ok = plan(
        "--model", "qwen3-8b", "--gpu", "l40s", "--mps-memory-limit-gib", "20", "--max-model-len", "8192",
        "--gpu-memory-utilization", "0.43",
    )  # fmt: skip
    assert rc == 0 and ok["headroom_bytes"] <= 1 * GIB  # measured against the limit, not the card
    assert (
        vramlab("plan", "--model", "qwen3-8b", "--gpu", "l40s", "--mps-memory-limit-gib", "nan").returncode
        == 2
    )
