"""`vramlab check-log` answering from the log alone: the card from the lines that name it, the model's
shape from llama.cpp's printed hyperparameters, a two-device llama.cpp split and `-ot` from its buffer
lines and command; a flag fills only what the log does not say, and the note names what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _narrow import some
from vramlab.logs.cards import card_named, gpu_for, llamacpp_placement
from vramlab.logs.check import check_log
from vramlab.logs.detect import parse_log

LOGS = Path(__file__).parent / "fixtures" / "logs"
VRAMLAB = str(Path(sys.executable).with_name("vramlab"))
MIB = 1 << 20


def cli_json(path: Path, *flags: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [VRAMLAB, "check-log", str(path), "--json", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_l40s_log_is_predicted_from_its_nvidia_smi_lines():
    out = cli_json(LOGS / "real" / "vllm-v1-0.28-l40s-qwen3-14b-korean.log")
    (o,) = out["observations"]
    pred = o["prediction"]
    assert pred is not None, o.get("prediction_error")
    assert pred["gpu_choice"].startswith("l40s (named in the log")
    assert abs(pred["relative_difference"]["weights_bytes"]) < 0.01
    assert abs(pred["relative_difference"]["kv_cache_bytes"]) < 0.05


@pytest.mark.parametrize(
    "name,logged_mib",
    [
        ("llamacpp-new.log", [8912.44, 8408.02]),
        ("real/llamacpp-b5622-2gpu-ot-experts-cpu.log", [135.76, 648.66]),
        ("derived/llamacpp-b5622-2gpu-model-in-no-catalog.log", [135.76, 648.66]),
    ],
)
def test_two_device_llamacpp_weights_per_card_within_5_percent_with_no_flags(name, logged_mib):
    out = cli_json(LOGS / name)
    obs = out["observations"]
    assert [o["rank"] for o in obs] == [0, 1]
    for o, mib in zip(obs, logged_mib, strict=True):
        assert o["weights_bytes"] == round(mib * MIB)
        pred = o["prediction"]
        assert pred is not None, o.get("prediction_error")
        assert abs(pred["relative_difference"]["weights_bytes"]) < 0.05, (name, o["rank"], pred["difference"])
        assert abs(pred["relative_difference"]["kv_cache_bytes"]) < 0.01  # each device's own layers' KV
        assert pred["compared_device"] == f"CUDA{o['rank']}"
        device = pred["devices"][o["rank"]]
        assert pred["difference"]["weights_bytes"] == device["model_buffer_bytes"] - o["weights_bytes"]


def test_a_model_in_no_catalog_is_predicted_from_the_printed_hyperparameters():
    out = cli_json(LOGS / "derived" / "llamacpp-b5622-2gpu-model-in-no-catalog.log")
    for o in out["observations"]:
        assert o["model"] == "Orbit-30B-A3B-Chat"
        pred = o["prediction"]
        assert pred["notes"] == [
            "model shape from the log's printed hyperparameters (no catalog entry by that name)"
        ]
        assert pred["relative_difference"]["kv_cache_bytes"] == 0  # 48 layers x 4 KV heads x 128, f16


def test_the_printed_shape_is_the_catalogs_for_the_catalog_model():
    """The same log under its real name: the catalog's Qwen3-30B-A3B, and both ways give the same plan."""
    named = check_log(LOGS / "real" / "llamacpp-b5622-2gpu-ot-experts-cpu.log")
    renamed = check_log(LOGS / "derived" / "llamacpp-b5622-2gpu-model-in-no-catalog.log")
    for a, b in zip(named.items, renamed.items, strict=True):
        assert a.comparison is not None and b.comparison is not None
        assert not a.notes  # the catalog entry, whose shape is the printed one
        pa = {r.field: r.predicted for r in a.comparison.rows}
        pb = {r.field: r.predicted for r in b.comparison.rows}
        assert pa["kv_cache_bytes"] == pb["kv_cache_bytes"]
        wa, wb = some(pa["weights_bytes"]), some(pb["weights_bytes"])
        assert abs(wa - wb) < 0.005 * wa


def _kv_lines(meta: dict[str, object]) -> list[str]:
    out = []
    for i, (k, v) in enumerate(meta.items()):
        kind = "str" if isinstance(v, str) else "u32"
        if isinstance(v, list):
            kind, v = f"arr[str,{len(v)}]", '["!", "\\"", "#", ...]'
        out.append(f"llama_model_loader: - kv {i:3d}: {k:>40} {kind:<16} = {v}")
    return out


def test_gguf_metadata_lines_alone_give_the_shape(tmp_path):
    """A log that prints only the loader's key/value lines (2024 builds at their default verbosity)."""
    meta = {
        "general.architecture": "llama",
        "general.name": "Private Llama 8B",
        "llama.block_count": 32,
        "llama.context_length": 131072,
        "llama.embedding_length": 4096,
        "llama.feed_forward_length": 14336,
        "llama.attention.head_count": 32,
        "llama.attention.head_count_kv": 8,
        "tokenizer.ggml.tokens": ["t"] * 128256,
    }
    lines = [
        "llama_model_loader: loaded meta data with 9 key-value pairs and 292 tensors from /m/private-8b.Q4_K_M.gguf",
        *_kv_lines(meta),
        "llm_load_print_meta: model ftype      = Q4_K - Medium",
        "llm_load_tensors: offloaded 33/33 layers to GPU",
        "llm_load_tensors:      CUDA0 buffer size =  4403.49 MiB",
        "llama_new_context_with_model: n_ctx      = 8192",
        "llama_kv_cache_init:      CUDA0 KV buffer size =  1024.00 MiB",
        "llama_new_context_with_model:      CUDA0 compute buffer size =   560.00 MiB",
    ]
    (tmp_path / "private.log").write_text("\n".join(lines) + "\n")
    out = cli_json(tmp_path / "private.log", "--gpu", "rtx-4090")
    (o,) = out["observations"]
    pred = o["prediction"]
    assert pred is not None, o.get("prediction_error")
    # 32 layers x 8 KV heads x 128 x (K + V) x 2 bytes x 8192 cells = 1024 MiB, as the engine printed
    assert pred["kv_cache_bytes"] == 1024 * MIB and pred["relative_difference"]["kv_cache_bytes"] == 0


def test_the_note_names_every_missing_fact_and_a_flag_fills_only_that(tmp_path):
    text = (LOGS / "real" / "vllm-v1-0.28-l40s-qwen3-14b-korean.log").read_text(encoding="utf-8")
    bare = "\n".join(ln for ln in text.splitlines() if "L40S" not in ln and "vllm serve" not in ln)
    (tmp_path / "bare.log").write_text(bare + "\n")
    (o,) = cli_json(tmp_path / "bare.log")["observations"]
    assert o["prediction"] is None
    assert "pass --model" in o["prediction_error"] and "pass --gpu" in o["prediction_error"]
    (o,) = cli_json(tmp_path / "bare.log", "--gpu", "l40s")["observations"]
    assert o["prediction"] is None and "pass --model" in o["prediction_error"]
    assert "--gpu" not in o["prediction_error"]  # the card is no longer missing
    (o,) = cli_json(tmp_path / "bare.log", "--gpu", "l40s", "--model", "qwen3-14b")["observations"]
    assert o["prediction"] is not None


@pytest.mark.parametrize(
    "printed,total_gib,catalog",
    [
        ("NVIDIA L40S", None, "l40s"),
        ("NVIDIA A100-PCIE-40GB", None, "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", None, "a100-80gb"),
        ("NVIDIA H100 80GB HBM3", None, "h100-80gb"),
        ("Tesla V100-SXM2-16GB", None, "v100-16gb"),
        ("NVIDIA GeForce RTX 4090 D", None, "rtx-4090"),
        ("nvidia-rtx-a6000", None, "rtx-a6000"),
        ("AMD Instinct MI300X", None, "mi300x"),
        ("NVIDIA A100", 40, "a100-40gb"),  # nvidia-smi's total picks the size
        ("NVIDIA A100", 80, "a100-80gb"),
    ],
)
def test_a_printed_card_name_finds_its_catalog_entry(printed, total_gib, catalog):
    card = card_named(printed, int(total_gib * 1e9) if total_gib else None)
    assert card is not None and card.name == catalog


@pytest.mark.parametrize("printed", ["NVIDIA Jetson AGX Xavier", "", "NVIDIA"])
def test_a_card_the_catalog_does_not_know_is_none(printed):
    assert card_named(printed) is None


def _vllm_with(prefix: list[str]) -> list[str]:
    return prefix + (LOGS / "real" / "vllm-v1-0.28-l40s-qwen3-14b-korean.log").read_text().splitlines()[4:]


@pytest.mark.parametrize(
    "lines,card",
    [
        (
            ["|   0  NVIDIA L40S                    On  |   00000000:81:00.0 Off |                    0 |"],
            "l40s",
        ),
        (["GPU models and configuration : GPU 0: NVIDIA H100 80GB HBM3"], "h100-80gb"),
        (["GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d3c-aa)"], "a100-40gb"),
        (
            [
                "   \\\\   /|    NVIDIA GeForce RTX 4090. Num GPUs = 1. Max memory: 23.635 GB. Platform: Linux."
            ],
            "rtx-4090",
        ),
    ],
)
def test_each_kind_of_card_line_names_the_card(lines, card):
    (o,) = parse_log(_vllm_with(lines)).observations
    got, why = gpu_for(o)
    assert got.name == card, why


def test_different_cards_listed_are_named_not_guessed():
    smi = ["0, NVIDIA L40S, 46068 MiB", "1, NVIDIA A100-SXM4-80GB, 81920 MiB"]
    (o,) = parse_log(_vllm_with(smi)).observations
    with pytest.raises(Exception, match="different cards.*NVIDIA A100-SXM4-80GB.*NVIDIA L40S.*pass --gpu"):
        gpu_for(o)


def test_a_card_known_only_by_its_nvidia_smi_total_is_that_size():
    (o,) = parse_log(_vllm_with(["0, NVIDIA Jetson AGX Xavier, 30536 MiB"])).observations
    card, why = gpu_for(o)
    assert card.memory_bytes == pytest.approx(30536 * MIB, rel=1e-6) and "nvidia-smi" in why


def test_a_unified_machine_the_catalog_knows_is_named_beside_its_nvidia_smi_total():
    """The catalog's sizes of a family include its unified machines (a Jetson Thor, not an 'a100' slice)."""
    (o,) = parse_log(_vllm_with(["0, NVIDIA Jetson AGX Thor, 125772 MiB"])).observations
    card, why = gpu_for(o)
    assert card.name == "jetson-agx-thor" and card.unified and "named in the log" in why


def test_a_printed_split_and_partial_offload_are_planned_as_printed():
    text = (LOGS / "llamacpp-new.log").read_text().splitlines()
    command = "./llama-server -m /models/Qwen3-30B-A3B-Q4_K_M.gguf -c 32768 -np 4 -ts 3,1 -ngl 40"
    lines = [command] + [ln.replace("49/49", "40/49") for ln in text[1:]]
    obs = parse_log(lines).observations
    placement = llamacpp_placement(obs[0])
    assert placement["tensor_split"] == (3.0, 1.0)  # the command's, not the free memory
    assert placement["n_gpu_layers"] == 40  # "offloaded 40/49 layers"
    assert [name for name, _ in placement["devices"]] == ["rtx-4090", "rtx-4090"]
