"""llama.cpp placement (capacity/engines/llamacpp_placement.py) against its own rules and real logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.engines import llamacpp_placement as place
from vramlab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
sys.path.insert(0, str(ROOT / "benchmarks"))


def _row(row_id: str) -> dict:
    for line in (ROOT / "benchmarks" / "data" / "observed_memory.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["row_id"] == row_id:
            return row
    raise KeyError(row_id)


def _model(row: dict):
    from accuracy import model_for

    configs = json.loads((ROOT / "benchmarks" / "data" / "model_configs.json").read_text())
    return model_for(row, configs)


def r223_settings(**over) -> EngineSettings:
    # The log's command: --ctx-size 16384 --n-gpu-layers 99 -ot ".ffn_.*_exps.=CPU", llama-cli (one sequence),
    # flash attention off; the default split by free memory, which the log prints: 9862 and 31518 MiB.
    base: dict[str, Any] = dict(
        engine="llama.cpp",
        engine_version="b5622",
        quantization="Q4_K_M",
        ctx_size=16384,
        parallel=1,
        n_ubatch=512,
        flash_attn=False,
        n_gpu_layers=99,
        override_tensor=(".ffn_.*_exps.=CPU",),
        tensor_split=(9862.0, 31518.0),
        devices=(
            ("rtx-4090", get_gpu("rtx-4090").memory_bytes),
            ("rtx-5090", get_gpu("rtx-5090").memory_bytes),
        ),
    )
    base.update(over)
    return EngineSettings(**base)


def test_r223_two_cards_with_the_experts_on_the_host_within_two_percent():
    row = _row("r223")
    est = estimate(_model(row), get_gpu("rtx-4090"), r223_settings())
    extra = row["extra"]
    for dev, model, kv, compute in zip(
        est.extra["devices"],
        extra["llamacpp_cuda_model_buffers_mib"],
        extra["llamacpp_cuda_kv_buffers_mib"],
        extra["llamacpp_cuda_compute_buffers_mib"],
        strict=True,
    ):
        assert dev["model_buffer_bytes"] / MIB == pytest.approx(model, rel=0.02)
        assert dev["kv_buffer_bytes"] / MIB == pytest.approx(kv, rel=0.02)
        assert dev["compute_buffer_bytes"] / MIB == pytest.approx(compute, rel=0.02)
    assert [d["layers"] for d in est.extra["devices"]] == [12, 36]  # 384 : 1152 MiB of KV = 12 : 36 layers
    host = est.extra["host"]
    assert host["mapped"] and host["mapped_buffer_bytes"] / MIB == pytest.approx(
        extra["llamacpp_cpu_mapped_mib"], rel=0.02
    )
    assert host["compute_buffer_bytes"] / MIB == pytest.approx(extra["llamacpp_host_compute_mib"], rel=0.02)
    assert est.fits and est.kv_cache_bytes == est.extra["devices"][0]["kv_buffer_bytes"]


def test_n_cpu_moe_48_is_the_same_as_the_override_pattern():
    m = _model(_row("r223"))
    a = estimate(m, get_gpu("rtx-4090"), r223_settings())
    b = estimate(m, get_gpu("rtx-4090"), r223_settings(override_tensor=(), n_cpu_moe=48))
    assert a.extra == b.extra
    some = estimate(m, get_gpu("rtx-4090"), r223_settings(override_tensor=(), n_cpu_moe=10))
    # the experts of layers 10-11 come back to CUDA0: gate and up 108 MiB each, down 157.5 (Q6_K, layer 10's
    # use_more_bits) and 108 MiB
    diff = some.extra["devices"][0]["model_buffer_bytes"] - a.extra["devices"][0]["model_buffer_bytes"]
    assert diff == (4 * 108 + 157.5 + 108) * MIB


def test_ngl_keeps_the_first_layers_on_the_host_and_the_output_only_above_n_layer():
    assert place.layer_devices(4, 2, [1.0], "layer", 0) == [-1, -1, 0, 0, -1]
    # -ngl 4 of 4: every repeating layer, not the output (it needs N > n_layer)
    assert place.layer_devices(4, 4, [1.0], "layer", 0) == [0, 0, 0, 0, -1]
    assert place.layer_devices(4, 5, [1.0], "layer", 0) == [0, 0, 0, 0, 0]
    assert place.layer_devices(4, 99, [1.0], "layer", 0) == [0, 0, 0, 0, 0]
    assert place.layer_devices(4, 0, [1.0], "layer", 0) == [-1] * 5


def test_the_eight_card_split_of_issue_9390():
    # 61 layers + output over 8 equal cards: the logged KV buffers are 8, 8, 8, 7 layers (5824 / 5096 MiB).
    where = place.layer_devices(61, 99, place.split_points([1.0] * 8), "layer", 0)
    counts = [where[:61].count(d) for d in range(8)]
    assert counts == [8, 8, 8, 7, 8, 8, 8, 6] and where[61] == 7


def test_row_and_none_split_modes_keep_the_kv_on_the_main_gpu():
    m = _model(_row("r223"))
    row = estimate(
        m, get_gpu("rtx-4090"), r223_settings(split_mode="row", override_tensor=(), tensor_split=(1.0, 1.0))
    )
    d0, d1 = row.extra["devices"]
    assert d1["kv_buffer_bytes"] == 0 and d0["kv_buffer_bytes"] == 1536 * MIB
    assert d0["model_buffer_bytes"] == pytest.approx(d1["model_buffer_bytes"], rel=0.01)
    none = estimate(m, get_gpu("rtx-4090"), r223_settings(split_mode="none", main_gpu=1, override_tensor=()))
    assert none.extra["devices"][0]["model_buffer_bytes"] == 0 and none.extra["devices"][1]["layers"] == 48


def test_no_kv_offload_puts_every_layers_kv_on_the_host():
    m = _model(_row("r223"))
    e = estimate(m, get_gpu("rtx-4090"), r223_settings(no_kv_offload=True))
    assert [d["kv_buffer_bytes"] for d in e.extra["devices"]] == [0, 0]
    assert e.extra["host"]["kv_buffer_bytes"] == 1536 * MIB


def test_bad_placement_flags_are_config_errors():
    m = _model(_row("r223"))
    for over in (
        {"override_tensor": ("noequals",)},
        {"override_tensor": ("x=CUDA7",)},
        {"override_tensor": ("([=CPU",)},
        {"main_gpu": 2},
        {"tensor_split": (1.0, 1.0, 1.0)},
        {"split_mode": "diagonal"},
    ):
        with pytest.raises(ConfigError):
            estimate(m, get_gpu("rtx-4090"), r223_settings(**over))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramlab", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_two_cards_json_and_text():
    r = _cli(
        "plan",
        "--model",
        "qwen3-8b",
        "--gpu",
        "rtx-4090,rtx-3090",
        "--engine",
        "llama.cpp",
        "--quantization",
        "Q4_K_M",
        "-c",
        "32k",
        "-ngl",
        "all",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [d["gpu"] for d in doc["devices"]] == ["rtx-4090", "rtx-3090"]
    assert doc["devices"][1]["output_layer"] and doc["host"]["layers"] == 0
    t = _cli(
        "plan",
        "--model",
        "qwen3-8b",
        "--gpu",
        "rtx-4090,rtx-3090",
        "--engine",
        "llama.cpp",
        "--quantization",
        "Q4_K_M",
        "-c",
        "32k",
        "-ngl",
        "20",
    )
    assert t.returncode == 4, t.stderr  # runs, 17 layers on the CPU: its own verdict and exit code
    assert "placement" in t.stdout and "offloaded 20/37 layers" in t.stdout
    assert (
        "verdict: RUNS WITH PART OF THE MODEL ON THE CPU: 20 of 37 layers on the GPU, 17 on the CPU"
        in t.stdout
    )


@pytest.mark.parametrize(
    "args", [["-ngl", "lots"], ["--tensor-split", "a,b"], ["--n-cpu-moe", "-3"], ["-ot", "x"]]
)
def test_cli_bad_placement_flags_exit_2(args):
    r = _cli("plan", "--model", "qwen3-8b", "--gpu", "rtx-4090", "--engine", "llama.cpp", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip(), r.stderr


def test_cli_placement_flags_need_llamacpp():
    r = _cli("plan", "--model", "qwen3-8b", "--gpu", "h100", "-ngl", "10")
    assert r.returncode == 2 and "--engine llama.cpp" in r.stderr


def _flag(text: str, flag: str) -> int:
    import re

    found = re.search(rf"{flag} (\d+)", text)
    assert found, text
    return int(found.group(1))


def test_what_fits_suggestions_re_plan_to_fits():
    m = _model(_row("r223"))
    gpu = get_gpu("rtx-4090")
    one = EngineSettings(engine="llama.cpp", quantization="Q4_K_M", ctx_size=65536, parallel=1, fit=False)
    est = estimate(m, gpu, one)
    assert not est.fits
    moe = next(t for t in est.suggestions if "--n-cpu-moe" in t)
    ngl = next(t for t in est.suggestions if "-ngl" in t)
    k, n = _flag(moe, "--n-cpu-moe"), _flag(ngl, "-ngl")
    assert (
        estimate(m, gpu, one.with_(n_cpu_moe=k)).fits
        and not estimate(m, gpu, one.with_(n_cpu_moe=k - 1)).fits
    )
    assert (
        estimate(m, gpu, one.with_(n_gpu_layers=n)).fits
        and not estimate(m, gpu, one.with_(n_gpu_layers=n + 1)).fits
    )
    # a context that fits with every layer offloaded is offered too, and re-plans to a fit
    ctx = next(t for t in est.suggestions if "--ctx-size" in t)
    assert estimate(m, gpu, one.with_(ctx_size=_flag(ctx, "--ctx-size"))).fits


def test_sweep_over_layers_and_experts():
    from vramlab.capacity.planning import parse_sweep, sweep

    m = _model(_row("r223"))
    base = EngineSettings(engine="llama.cpp", quantization="Q4_K_M", ctx_size=65536, parallel=1)
    result = sweep(m, get_gpu("rtx-4090"), base, [parse_sweep("n-cpu-moe=0,1"), parse_sweep("ngl=49")])
    fits = {r["n_cpu_moe"]: r["fits"] for r in result.rows}
    assert fits == {0: False, 1: True}  # the same answer the what-fits suggestion gives


@pytest.mark.parametrize("ngl", [0, 20, -1])
@pytest.mark.parametrize("cards", [("rtx-3070",), ("rtx-4090", "rtx-3090")])
def test_the_device_table_and_the_verdict_are_the_same_figures(ngl, cards):
    from vramlab.sources import resolve_model

    m = resolve_model("qwen3-8b", offline=True)
    devices = tuple((c, get_gpu(c).memory_bytes) for c in cards) if len(cards) > 1 else ()
    e = estimate(
        m,
        get_gpu(cards[0]),
        EngineSettings(
            engine="llama.cpp", quantization="Q4_K_M", ctx_size=8192, n_gpu_layers=ngl, devices=devices
        ),
    )
    first = e.extra["devices"][0]
    assert first["headroom_bytes"] == e.headroom_bytes
    assert first["kv_buffer_bytes"] == e.kv_cache_bytes and first["model_buffer_bytes"] == e.weights_bytes
    placed = sum(d["layers"] for d in e.extra["devices"]) + e.extra["host"]["layers"]
    assert placed == m.num_layers
