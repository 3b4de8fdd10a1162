"""check-log on real start-up excerpts pasted into public issues (tests/fixtures/logs/real/).

The figures each excerpt prints were written down by hand from the text into sources.json,
with the page the excerpt comes from; they are not produced by the parser. The test reads
every excerpt (the installed command as a subprocess for one per engine, the library for the
rest) and asserts that at least 90 % of the printed figures come back, overall and per engine.
"""

from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vramlab.logs.check import check_log

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"
INDEX = json.loads((REAL / "sources.json").read_text(encoding="utf-8"))["files"]
UNITS = {"GiB": 1 << 30, "MiB": 1 << 20, "B": 1, None: 1}
ENGINES = ("vllm", "sglang", "tgi", "llama.cpp", "ollama")
# One file per engine goes through the installed command (JSON on stdout), the rest through
# the library call behind it.
VIA_CLI = {
    "vllm-0.6.4-table-pr10511.log",
    "sglang-tp4-kv-pr15909.log",
    "tgi-1.4-json-gke-l4.log",
    "llamacpp-2025-8gpu-q4kv-issue9390.log",
    "ollama-0.5-offload-estimate-ollama8447.log",
}


def _json_of(name: str) -> dict[str, Any]:
    if name in VIA_CLI:
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        r = subprocess.run(
            [sys.executable, "-m", "vramlab", "check-log", str(REAL / name), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert r.returncode == 0, (name, r.stderr)
        assert r.stderr == "", r.stderr
        return json.loads(r.stdout)
    return check_log(REAL / name).to_json()


@pytest.fixture(scope="module")
def outputs() -> dict[str, dict[str, Any]]:
    return {name: _json_of(name) for name in sorted(INDEX)}


def _read(out: dict[str, Any], field: str, value: float | str, unit: str | None) -> bool:
    for obs in out["observations"]:
        got = (
            obs.get("extra", {}).get(field[6:])
            if field.startswith("extra.")
            else obs.get("settings", {}).get(field[9:])
            if field.startswith("settings.")
            else obs.get(field)
        )
        if isinstance(value, str):
            if got == value:
                return True
        elif isinstance(got, (int, float)) and math.isclose(
            got, value * UNITS[unit], rel_tol=1e-4, abs_tol=2
        ):
            return True
    return False


def test_the_corpus_is_real_and_indexed():
    files = {p.name for p in REAL.glob("*.log")}
    assert files == set(INDEX), files ^ set(INDEX)
    assert len(files) >= 40
    by_engine = collections.Counter(e["engine"] for e in INDEX.values())
    assert set(by_engine) == set(ENGINES) and min(by_engine.values()) >= 3, by_engine
    for name, entry in INDEX.items():
        assert entry["source"].strip() and entry["era"].strip(), name
        assert entry["figures"] or entry.get("failures"), name
    # vLLM from 0.3 to 0.2x, V0 and V1, each era with its own wording
    eras = " | ".join(e["era"] for e in INDEX.values() if e["engine"] == "vllm")
    for needle in (
        "v0 0.3",
        "v0 0.6.2",
        "v0 0.6.4",
        "v0 0.7",
        "v0 0.8",
        "v1 0.7",
        "v1 0.10",
        "v1 0.15",
        "v1 0.21",
    ):
        assert needle in eras, needle


def test_at_least_90_percent_of_printed_figures_are_read(outputs):
    total: collections.Counter[str] = collections.Counter()
    read: collections.Counter[str] = collections.Counter()
    missed = []
    for name, entry in INDEX.items():
        for field, value, unit in entry["figures"]:
            ok = _read(outputs[name], field, value, unit)
            total[entry["engine"]] += 1
            read[entry["engine"]] += ok
            if not ok:
                missed.append((name, field, value))
    overall = sum(read.values()) / sum(total.values())
    assert overall >= 0.90, (overall, missed)
    # The README and the docs quote the count: they must say what the corpus gives.
    root = Path(__file__).parent.parent
    quoted = f"{sum(read.values())} of the {sum(total.values())} figures"
    assert quoted in (root / "README.md").read_text(encoding="utf-8"), quoted
    doc = (root / "docs" / "logs-and-calibration.md").read_text(encoding="utf-8")
    assert (
        f"today {sum(read.values())} of {sum(total.values())};" in doc
        and f"holds {len(INDEX)} excerpts" in doc
    )
    for engine in ENGINES:
        assert read[engine] / total[engine] >= 0.90, (engine, read[engine], total[engine], missed)


def test_every_excerpt_parses_with_no_flags_and_names_the_engine(outputs):
    for name, entry in INDEX.items():
        out = outputs[name]
        expected = {"ollama", "llama.cpp"} if entry["engine"] == "ollama" else {entry["engine"]}
        assert out["engine"] in expected, (name, out["engine"])
        # every excerpt with a figure returns it in observations[] (a failure-only one has none)
        assert out["observations"] or out["failures"], name
        for obs in out["observations"]:
            # no model, card or version given: the figures are there and the reason for no
            # prediction is one line
            assert obs["prediction"] is not None or "\n" not in obs["prediction_error"], name
            assert obs["era"]["label"], name


def test_failed_start_ups_are_named(outputs):
    for name, entry in INDEX.items():
        names = [f["name"] for f in outputs[name]["failures"]]
        for expected in entry.get("failures", []):
            assert expected in names, (name, names)
    oom = outputs["vllm-v1-fail-oom-at-load-issue28143.log"]["failures"][0]
    assert oom["kind"] == "oom" and oom["during"] == "start-up"  # an OOM while loading the weights
    assert oom["details"]["requested"] == "896.00 MiB" and oom["details"]["total"] == "93.09 GiB"


def test_a_restart_is_a_new_start_up_not_a_sum(outputs):
    for name, entry in INDEX.items():
        if "startups" not in entry:
            continue
        out = outputs[name]
        seen = {o["startup"] for o in out["observations"]}
        assert len(seen) == entry["startups"], (name, seen)
    # the two ROCm start-ups keep their own KV figures (6.63 GiB is not added to 14.08 GiB)
    out = outputs["vllm-v0-rocm-restarts-gfx906-10.log"]
    kv = sorted(o["kv_cache_bytes"] for o in out["observations"])
    assert kv == [round(6.63 * (1 << 30)), round(14.08 * (1 << 30))]


def test_the_era_is_inferred_from_the_wording_and_said_so(outputs):
    def era(name: str) -> dict[str, Any]:
        out = outputs[name]
        return out["observations"][0]["era"]

    assert era("vllm-0.6.4-table-pr10511.log")["label"] == "vLLM V0 0.6.4-0.6.5"
    assert era("vllm-0.6.3-oneline-issue10517.log")["label"] == "vLLM V0 0.6.2-0.6.3"
    assert era("vllm-v1-0.7-pr12569.log")["vllm_engine"] == "v1"
    assert era("vllm-0.7-v0-pr12126.log")["vllm_engine"] == "v0"
    assert all(era(n)["inferred"] for n in ("vllm-0.6.4-table-pr10511.log", "tgi-2.2-v3-a10g-tutorial.log"))


def test_a_model_named_in_the_log_is_resolved_against_the_catalog():
    # 'meta-llama/Meta-Llama-3-8B' is not a catalog name, its spelling is: the prediction is
    # made with the era the wording gives (V0 0.6.4) and the card given.
    report = check_log(REAL / "vllm-0.6.4-table-pr10511.log", gpu="h100-80gb")
    item = report.items[0]
    assert item.comparison is not None, item.error
    assert item.settings_used["vllm_engine"] == "v0" and item.settings_used["engine_version"] == "0.6.4"
    weights = next(r for r in item.comparison.rows if r.field == "weights_bytes")
    assert weights.relative is not None and abs(weights.relative) < 0.01


def test_llamacpp_kv_cells_per_stream_or_in_all_is_decided_by_n_ctx():
    from vramlab.logs.llamacpp import parse

    # A write-up of `llama-server -c 8192 -np 4` (kv_unified = false) quotes this line and says the
    # 2,048 cells are each slot's share (text id 70947194673 in the search index):
    line = (
        "llama_kv_cache: size = 1024.00 MiB (  2048 cells,  32 layers,  4/4 seqs), "
        "K (f16):  512.00 MiB, V (f16):  512.00 MiB"
    )
    alone = parse([line])[0]
    # The same '4/4 seqs' wording also comes with cells meaning the whole cache (the Vulkan
    # excerpt: 65,536 cells for n_ctx 65,536): alone, the line cannot say which; nothing is guessed.
    assert alone.kv_cache_tokens is None and alone.settings["parallel"] == 4
    assert alone.kv_cache_bytes == 1024 * (1 << 20)
    with_ctx = parse(["llama_context: n_ctx                 = 8192", line])[0]
    assert (with_ctx.kv_cache_tokens, with_ctx.max_model_len) == (8192, 2048)
    vulkan = check_log(REAL / "llamacpp-2026-vulkan-unified-4slots.log").items[0].observation
    assert vulkan.kv_cache_tokens == 65536 and vulkan.extra["kv_unified"] is True


def test_a_llamacpp_restart_in_one_file_is_two_start_ups(tmp_path):
    # Two real excerpts one after the other, as a server log looks after a restart.
    both = tmp_path / "restart.log"
    both.write_text(
        (REAL / "llamafile-2024-rtx4080-llamafile552.log").read_text()
        + (REAL / "llamafile-2024-rtx4080-llamafile552.log").read_text()
    )
    out = check_log(both).to_json()
    obs = out["observations"]
    assert sorted(o["startup"] for o in obs) == [0, 1]
    assert all(o["kv_cache_bytes"] == 180 * (1 << 20) for o in obs)  # 180 MiB each, not 360
    assert all(o["weights_bytes"] == round(7317.71 * (1 << 20)) for o in obs)


@pytest.mark.parametrize(
    "printed,catalog",
    [
        # names as the excerpts print them: a ROCm model path, a Hub cache .gguf path (issue 28524's
        # command), a Hub id of a base model, a GGUF general.name with spaces
        ("/models/awq/gemma-3-27b-it-int4-awq", "gemma-3-27b-it"),
        (
            "/root/.cache/huggingface/hub/models--Qwen--Qwen3-4B-GGUF/snapshots/bc640142c66e1fdd12af0bd68f40445458f3869b/"
            "Qwen3-4B-Q4_K_M.gguf",
            "qwen3-4b",
        ),
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b-instruct"),
        ("Meta Llama 3.1 70B Instruct", "llama-3.1-70b-instruct"),
        # a Hugging Face cache snapshot directory (the SGLang project note's --model-path)
        (
            "/home/dell/.cache/huggingface/hub/models--Qwen--Qwen3-14B/snapshots/40c069824f4251a91eefaf281ebe4c544efd3e18",
            "qwen3-14b",
        ),
    ],
)
def test_a_model_the_log_names_resolves_under_the_catalogs_spelling(printed, catalog):
    from vramlab.logs.check import _resolve

    spec, why = _resolve(printed, offline=True)
    assert spec is not None, why
    assert spec.name == catalog


def test_a_model_the_catalog_does_not_know_is_one_line_naming_the_real_switches():
    from vramlab.logs.check import _resolve

    spec, why = _resolve("deepseek-coder-v2-lite-instruct:q6_k_l", offline=True)
    assert spec is None and "\n" not in why and "--online" in why and "--model" in why
    assert "--offline" not in why


def test_an_oom_after_the_kv_decision_is_during_serving(tmp_path):
    # Two real excerpts: a start-up that sized its KV cache, then a CUDA OOM line.
    log = tmp_path / "served-then-oom.log"
    log.write_text(
        (REAL / "vllm-v1-2026-issue33263.log").read_text()
        + (REAL / "vllm-v1-fail-oom-at-load-issue28143.log").read_text()
    )
    out = check_log(log).to_json()
    assert out["observations"][0]["complete"] is True
    assert [f["during"] for f in out["failures"]] == ["serving"]
    alone = check_log(REAL / "vllm-v1-fail-oom-at-load-issue28143.log").to_json()
    assert [f["during"] for f in alone["failures"]] == ["start-up"]


def test_noise_between_the_lines_changes_nothing(tmp_path, outputs):
    # Real lines that carry no start-up figure (a progress bar, a JIT notice, a request log),
    # taken from the excerpts themselves, put after every line of every other excerpt.
    noise = [
        "Capturing CUDA graphs (decode, FULL): 100%|████████████████████| 11/11 [00:00<00:00, 29.99it/s]",
        "INFO 05-26 21:34:14 [jit_monitor.py:54] Kernel JIT monitor activated — Triton JIT compilations during "
        "inference will be logged as warnings.",
        '[GIN] 2025/05/16 - 15:44:10 | 200 |      102.47µs |       127.0.0.1 | GET      "/api/ps"',
    ]
    for name, entry in INDEX.items():
        if "diff" in name or not entry["figures"]:
            continue  # a diff's sides are marked line by line; noise would unmark it
        lines = (REAL / name).read_text(encoding="utf-8").splitlines()
        noisy = tmp_path / name
        noisy.write_text(
            "\n".join(x for ln in lines for x in (ln, noise[len(ln) % 3])) + "\n", encoding="utf-8"
        )
        out = check_log(noisy).to_json()
        for field, value, unit in entry["figures"]:
            assert _read(out, field, value, unit) == _read(outputs[name], field, value, unit), (name, field)


def test_a_command_pasted_over_several_lines_gives_its_flags_even_with_lines_in_between(tmp_path):
    # aws-samples' README (vllm-v1-0.24-tp4-l40s-aws-sample.log) and a SGLang project note paste
    # `vllm serve` / `sglang.launch_server` with one flag per continuation line.
    vllm = check_log(REAL / "vllm-v1-0.24-tp4-l40s-aws-sample.log").to_json()["observations"][0]
    assert vllm["settings"]["tensor_parallel_size"] == 4 and vllm["gpu_memory_utilization"] == 0.9
    assert vllm["kv_cache_tokens"] == 1037152  # `GPU KV cache size:         1,037,152 tokens` (aligned)
    sglang = check_log(REAL / "sglang-2026-tp4-rtx4090-qwen3-14b.log").to_json()["observations"][0]
    assert (
        sglang["settings"]["tensor_parallel_size"] == 4 and sglang["settings"]["mem_fraction_static"] == 0.8
    )
    # a note between two continuation lines changes nothing: each flag line is read on its own
    lines = (REAL / "vllm-v1-0.24-tp4-l40s-aws-sample.log").read_text(encoding="utf-8").splitlines()
    lines.insert(2, "# (the README's comment between two flags)")
    noisy = tmp_path / "noisy.log"
    noisy.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert check_log(noisy).to_json()["observations"][0]["settings"]["tensor_parallel_size"] == 4


def test_the_cuda_graph_advice_keeps_both_alternative_utilizations():
    out = check_log(REAL / "vllm-v1-0.21-compose-timestamps-graph-estimate.log").to_json()["observations"][0]
    assert out["gpu_memory_utilization"] == 0.9
    assert (
        out["extra"]["util_without_graph_profiling"] == 0.8878 and out["extra"]["util_to_keep_kv"] == 0.9122
    )


def test_the_start_up_banner_names_the_version_and_the_model():
    # vLLM 0.11+ prints its version and model beside block-letter art (the MI300X deployment doc).
    obs = check_log(REAL / "vllm-v1-0.17.1-rocm-mi300x.log").to_json()["observations"][0]
    assert obs["engine_version"] == "0.17.1" and obs["era"]["inferred"] is False
    assert obs["model"] == "Qwen/Qwen2.5-14B-Instruct"
    # and the SGLang note's --model-path on a continuation line resolves under the catalog's spelling
    report = check_log(REAL / "sglang-2026-tp4-rtx4090-qwen3-14b.log", gpu="rtx-4090")
    item = report.items[0]
    assert item.comparison is not None, item.error
    assert item.settings_used["tensor_parallel_size"] == 4
