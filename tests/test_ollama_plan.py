"""Ollama's offload decision (capacity/engines/ollama.py) against the estimate lines of real logs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vramlab.capacity import EngineSettings, custom_gpu, estimate, get_gpu
from vramlab.capacity.engines.ollama import full_offload
from vramlab.logs.check import check_log
from vramlab.sources import resolve_model

ROOT = Path(__file__).resolve().parent
REAL = ROOT / "fixtures" / "logs" / "real"
GIB, MIB = 1 << 30, 1 << 20
# The last releases that estimate for themselves (llm/memory.go): these tests read that estimator, so they pin it;
# the default release (0.30+) runs llama-server and its --fit (tests/test_ollama_target.py).
ESTIMATOR = "0.11.6"


def _rows(path: Path, **kw) -> dict[str, tuple[float, float]]:
    report = check_log(path, **kw)
    cmp = next(it.comparison for it in report.items if it.comparison is not None)
    return {
        r.field: (r.observed, r.predicted)
        for r in cmp.rows
        if r.observed is not None and r.predicted is not None
    }


@pytest.mark.parametrize(
    ("log", "kw"),
    [
        # ollama/ollama#8447: DeepSeek-V3 Q4_K_M on one 24 GB card, Ollama 0.5 (its default num_ctx 2048)
        (
            REAL / "ollama-0.5-offload-estimate-ollama8447.log",
            {"model": "deepseek-v3", "quantization": "Q4_K_M", "engine_version": "0.5.7"},
        ),
        # ollama/ollama#12000: gemma3 12B Q4_K_M with its vision projector, Ollama 0.11, num_ctx 8192
        (
            REAL / "ollama-0.11-offload-syslog-ollama12000.log",
            {"model": "gemma-3-12b-it", "quantization": "Q4_K_M"},
        ),
        # the assembled 0.9.3 fixture (figures of ollama/ollama#11292): Llama 3.1 8B, num_ctx 4096 x 2 parallel
        (
            ROOT / "fixtures" / "logs" / "ollama-old.log",
            {"model": "llama-3.1-8b-instruct", "quantization": "Q4_K_M"},
        ),
    ],
)
def test_ollama_estimate_lines_are_reproduced(log, kw):
    rows = _rows(log, **kw)
    observed, predicted = rows["layers_offloaded"]
    assert predicted == observed  # Ollama's own decision: how many layers it offloads
    for field in ("kv_cache_bytes", "weights_bytes", "activation_peak_bytes"):
        seen, ours = rows[field]
        # the log prints one decimal of GiB/MiB (HumanBytes2): 2 % covers that rounding and the mix's average
        assert ours == pytest.approx(seen, rel=0.02), field


def test_the_graph_figures_are_ollamas_formulas_to_the_printed_digit():
    m = resolve_model("deepseek-v3", offline=True)
    e = estimate(
        m, custom_gpu(23.3), EngineSettings(engine="ollama", engine_version="0.5.7", quantization="Q4_K_M")
    )
    o = e.extra["ollama"]
    assert (
        round(o["memory_graph_full_bytes"] / MIB, 1) == 654.0
        and round(o["memory_graph_partial_bytes"] / MIB, 1) == 1019.5
    )
    # the rest run on the CPU: Ollama still serves it (the plan's verdict: partial offload), no refusal
    assert o["layers_offload"] == 5 and e.fits and not e.reasons and e.suggestions


def test_release_defaults_num_ctx_parallel_and_walk_direction():
    m = resolve_model("deepseek-v3", offline=True)
    card = custom_gpu(23.3)
    old = estimate(m, card, EngineSettings(engine="ollama", engine_version="0.5.7", quantization="Q4_K_M"))
    new = estimate(m, card, EngineSettings(engine="ollama", engine_version="0.11.6", quantization="Q4_K_M"))
    assert old.settings["num_ctx"] == 2048 and new.settings["num_ctx"] == 4096
    # v0.5.7 walks blk.0 upwards (DeepSeek's three dense layers are small), v0.7.0+ from the last MoE layer down
    small = estimate(
        m,
        card,
        EngineSettings(engine="ollama", engine_version="0.11.6", quantization="Q4_K_M", max_model_len=2048),
    )
    assert small.extra["ollama"]["layers_offload"] < old.extra["ollama"]["layers_offload"]
    q = resolve_model("qwen3-8b", offline=True)
    fits4 = estimate(
        q, get_gpu("rtx-4090"), EngineSettings(engine="ollama", engine_version="0.9.3", quantization="Q4_K_M")
    )
    assert fits4.settings["num_parallel"] == 4  # OLLAMA_NUM_PARALLEL unset before 0.10: 4 when it fits fully
    one = estimate(q, get_gpu("rtx-4090"), EngineSettings(engine="ollama", quantization="Q4_K_M"))
    assert one.settings["num_parallel"] == 1


def test_quantized_kv_needs_flash_attention():
    q = resolve_model("qwen3-8b", offline=True)
    gpu = get_gpu("rtx-4090")
    base = EngineSettings(
        engine="ollama", engine_version=ESTIMATOR, quantization="Q4_K_M", max_model_len=16384
    )
    f16 = estimate(q, gpu, base.with_(kv_cache_dtype="q8_0"))  # without OLLAMA_FLASH_ATTENTION: f16, noted
    q8 = estimate(q, gpu, base.with_(kv_cache_dtype="q8_0", flash_attn=True))
    assert f16.settings["kv_cache_type"] == "f16" and any("flash attention disabled" in n for n in f16.notes)
    assert (
        q8.extra["ollama"]["memory_required_kv_bytes"] * 2 == f16.extra["ollama"]["memory_required_kv_bytes"]
    )


def test_num_gpu_and_overhead_are_honoured():
    q = resolve_model("qwen3-8b", offline=True)
    gpu = get_gpu("rtx-4090")
    old = EngineSettings(engine="ollama", engine_version=ESTIMATOR, quantization="Q4_K_M")
    e = estimate(q, gpu, old.with_(n_gpu_layers=10))
    assert e.extra["ollama"]["layers_offload"] == 10
    full = estimate(q, gpu, old.with_(max_model_len=40960))
    held = estimate(
        q,
        gpu,
        old.with_(max_model_len=40960, ollama_gpu_overhead_bytes=12 * GIB),
    )
    assert full.fits and held.extra["ollama"]["layers_offload"] < full.extra["ollama"]["layers_offload"]


def test_suggestions_re_plan_to_a_full_offload():
    q = resolve_model("qwen3-8b", offline=True)
    gpu = get_gpu("rtx-3070")
    s = EngineSettings(engine="ollama", engine_version=ESTIMATOR, quantization="Q4_K_M", max_model_len=32768)
    e = estimate(q, gpu, s)
    assert not full_offload(e) and e.suggestions
    ctx = next(t for t in e.suggestions if "num_ctx" in t)
    m = re.search(r"num_ctx to ([\d,]+)", ctx)
    assert m is not None, ctx
    n = int(m.group(1).replace(",", ""))
    assert full_offload(estimate(q, gpu, s.with_(max_model_len=n)))
    assert not full_offload(estimate(q, gpu, s.with_(max_model_len=n + 64)))


def test_cli_plan_and_check_log():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "plan",
            "--model",
            "qwen3-8b",
            "--gpu",
            "rtx-3070",
            "--engine",
            "ollama",
            "--quantization",
            "Q4_K_M",
            "--max-model-len",
            "32k",
            "--engine-version",
            ESTIMATOR,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 4, r.stderr  # runs with part of the model on the CPU: no failure, its own code
    doc = json.loads(r.stdout)
    assert (
        doc["ollama"]["layers_offload"] < doc["ollama"]["layers_model"]
        and doc["settings"]["num_ctx"] == 32768
    )
    host = doc["verdict_detail"]["host"]
    assert doc["verdict"] == "partial_offload" and doc["verdict_detail"]["exit_code"] == 4
    assert host["layers_on_gpu"] == doc["ollama"]["layers_offload"] and host["layers_total"] == 37
    # the per-token figure is this GPU's: the offloaded layers' KV only
    share = doc["kv_cache_bytes"] / (doc["settings"]["num_ctx"] * doc["settings"]["num_parallel"])
    assert abs(doc["kv_bytes_per_token"] - share) <= 1
    assert doc["kv_bytes_per_token"] * doc["settings"]["num_ctx"] < doc["ollama"]["memory_required_kv_bytes"]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "plan",
            "--model",
            "qwen3-8b",
            "--gpu",
            "l4",
            "--ollama-gpu-overhead",
            "1GiB",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--engine ollama" in bad.stderr
    c = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "check-log",
            str(REAL / "ollama-0.5-offload-estimate-ollama8447.log"),
            "--model",
            "deepseek-v3",
            "--quantization",
            "Q4_K_M",
            "--engine-version",
            "0.5.7",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert c.returncode == 0 and re.search(r"layers_offloaded\s+5\s+5", c.stdout), c.stdout


def test_several_cards_take_the_fewest_that_hold_every_layer():
    q = resolve_model("qwen3-8b", offline=True)
    cards = (("rtx-3070", get_gpu("rtx-3070").memory_bytes), ("rtx-4090", get_gpu("rtx-4090").memory_bytes))
    s = EngineSettings(
        engine="ollama", engine_version=ESTIMATOR, quantization="Q4_K_M", max_model_len=32768, devices=cards
    )
    e = estimate(q, get_gpu("rtx-3070"), s)
    # pickBestFullFitByLibrary: the card with the most free memory alone holds all 37 layers
    assert e.fits and e.extra["ollama"]["layers_split"] == [0, 37]
    big = resolve_model("qwen3-32b", offline=True)
    two = estimate(big, get_gpu("rtx-3070"), s.with_(devices=cards[1:] * 2))
    assert sum(two.extra["ollama"]["layers_split"]) == two.extra["ollama"]["layers_offload"]
    assert all(n > 0 for n in two.extra["ollama"]["layers_split"])  # no single card fits: both take layers


def _plan_json(*args: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "plan", "--offline", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode in (0, 3, 4), r.stderr
    return json.loads(r.stdout)


def test_gpt_oss_sliding_kv_graph_and_mxfp4_weights_by_release():
    """A public Ollama 0.11.10 start-up on a Strix Halo's 63.8 GiB (benchmarks/data r262): gpt-oss-120b MXFP4 at
    num_ctx 8192 printed memory.required.kv 450.0 MiB, memory.graph.full / partial 122.0 MiB, weights.total 59.7 GiB
    and 37 of 37 layers. By hand: one layer's cell is (K 64 + V 64) x 8 KV heads x 2 B = 2048 B; the 18 odd layers
    hold 8192 cells (16 MiB each, 288 MiB), the 18 even (sliding) ones 1 x 4096 + 512 (9 MiB each, 162 MiB): 450 MiB.
    kvTotal (every layer at 8192) = 36 x 16 = 576 MiB, GQA 64 / 8."""
    card = ["--engine", "ollama", "--model", "openai/gpt-oss-120b", "--quantization", "mxfp4"]
    card += ["--max-model-len", "8192", "--gpu-memory-gib", "63.8"]
    new = _plan_json(*card, "--engine-version", "0.11.10")
    o = new["ollama"]
    assert o["memory_required_kv_bytes"] == 450 * MIB
    # v0.11.8 on: the model wants flash attention; (4 x 1 + 8192 >> 10 + 110) MiB = 122 MiB, full = partial
    assert o["memory_graph_partial_bytes"] == o["memory_graph_full_bytes"] == 122 * MIB
    assert new["settings"]["flash_attention"] is True
    assert o["layers_offload"] == o["layers_model"] == 37
    # GGUF MXFP4 blocks are 17 B per 32 weights, unpadded: the printed 59.7 GiB (one decimal), not vLLM's padded rows
    assert o["memory_weights_total_bytes"] == pytest.approx(59.7 * GIB, rel=0.005)
    # v0.11.6: no flash attention unless asked; partial = 2 x 64 / 8 x 576 MiB / 6 = 1536 MiB and full takes it
    mid = _plan_json(*card, "--engine-version", "0.11.6")["ollama"]
    assert mid["memory_graph_partial_bytes"] == mid["memory_graph_full_bytes"] == 1536 * MIB
    assert mid["memory_required_kv_bytes"] == 450 * MIB
    # v0.11.4: full = 4 x 64 / 8 x 576 / 6 = 3072 MiB and partial twice that
    old = _plan_json(*card, "--engine-version", "0.11.4")["ollama"]
    assert (old["memory_graph_full_bytes"], old["memory_graph_partial_bytes"]) == (3072 * MIB, 6144 * MIB)


def test_the_default_release_is_the_newest_ollama_through_llama_server():
    """Without --engine-version Ollama is planned at v0.32.15, which starts llama-server at the build its
    LLAMA_CPP_VERSION file pins (b10488), the llama.cpp default too; an estimate line without a printed version is
    still checked against the estimator that printed it."""
    q = resolve_model("qwen3-8b", offline=True)
    e = estimate(q, get_gpu("rtx-4090"), EngineSettings(engine="ollama", quantization="Q4_K_M"))
    assert e.settings["server"] == "llama-server" and e.settings["llama_cpp_build"] == "b10488"
    assert "ollama" not in e.extra and "fit" in e.extra
    assert EngineSettings(engine="llama.cpp").resolved_version == "b10488"
    rows = _rows(
        REAL / "ollama-0.11-offload-syslog-ollama12000.log", model="gemma-3-12b-it", quantization="Q4_K_M"
    )
    assert rows["layers_offloaded"][0] == rows["layers_offloaded"][1]


def test_the_gpt_oss_graph_rule_is_named_between_two_releases():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "plan",
            "--offline",
            "--engine",
            "ollama",
            "--model",
            "openai/gpt-oss-120b",
        ]
        + ["--quantization", "mxfp4", "--max-model-len", "8192", "--gpu", "strix-halo-64g"]
        + ["--engine-version", "0.11.6", "--vs-engine-version", "0.11.10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    flash = next(line for line in r.stdout.splitlines() if line.startswith("flash_attention"))
    assert flash.split()[1:] == ["no", "yes", "GPTOSS_FLASH_FROM"]
