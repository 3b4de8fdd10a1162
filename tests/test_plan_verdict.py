"""One verdict for every engine: the text, the `--json` `verdict`, the safe operating point and the exit code
agree on every model x card x engine x settings combination (capacity/verdict.py, docs/capacity-model.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vramlab.capacity import EngineSettings, get_gpu
from vramlab.capacity.planning import make_plan, sweep
from vramlab.capacity.verdict import EXIT_CODES, HEADLINES, KINDS
from vramlab.errors import ConfigError
from vramlab.report.plan_text import render_plan
from vramlab.sources import resolve_model

MODELS = [
    "llama-3.1-8b-instruct",
    "qwen3-8b",
    "qwen3-30b-a3b",
    "llama-3.1-70b-instruct",
    "phi-4",
    "gemma-3-12b-it",
]
CARDS = ["t4", "rtx-3070", "l4", "rtx-4090", "a100-80gb", "h100-80gb"]
SPECS = {name: resolve_model(name, offline=True) for name in MODELS}


@st.composite
def plans(draw: st.DrawFn) -> tuple[str, str, EngineSettings]:
    engine = draw(st.sampled_from(["vllm", "sglang", "tgi", "llama.cpp", "ollama", "transformers"]))
    model, card = draw(st.sampled_from(MODELS)), draw(st.sampled_from(CARDS))
    length = draw(st.sampled_from([None, 2048, 8192, 32768]))
    s = EngineSettings(engine=engine, max_model_len=length)
    if engine in ("vllm", "sglang", "tgi"):
        s = s.with_(tensor_parallel_size=draw(st.sampled_from([1, 2])))
    if engine in ("llama.cpp", "ollama"):
        s = s.with_(quantization=draw(st.sampled_from(["Q4_K_M", "Q8_0"])))
        # Ollama's estimator eras and its llama-server era (planned as llama.cpp with --fit); llama.cpp before --fit
        versions = [None, "0.5.7", "0.30.0"] if engine == "ollama" else [None, "b5000"]
        s = s.with_(engine_version=draw(st.sampled_from(versions)))
        s = s.with_(n_gpu_layers=draw(st.sampled_from([None, None, 8, 24])))
    if engine == "llama.cpp" and SPECS[model].is_moe:
        s = s.with_(n_cpu_moe=draw(st.sampled_from([0, 4, 24])))
    if engine == "transformers":
        s = s.with_(max_num_seqs=draw(st.sampled_from([1, 4])))
    return model, card, s


def _safe_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("safe operating point"))


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_verdict_text_json_safe_point_and_exit_code_agree(case: tuple[str, str, EngineSettings]) -> None:
    name, card, s = case
    gpu, spec = get_gpu(card), SPECS[name]
    try:
        plan = make_plan(spec, gpu, s)
    except ConfigError:
        assume(False)
        return
    v, est, safe = plan.verdict, plan.estimate, plan.safe
    doc = plan.to_json()
    text = render_plan(plan, spec, gpu)
    verdict_lines = [line for line in text.splitlines() if line.startswith("verdict: ")]
    assert v.kind in KINDS and doc["verdict"] == v.kind
    assert doc["verdict_detail"]["exit_code"] == EXIT_CODES[v.kind] == v.exit_code
    assert len(verdict_lines) == 1 and verdict_lines[0].startswith(f"verdict: {HEADLINES[v.kind]}")
    assert doc["verdict_detail"]["summary"] == verdict_lines[0].removeprefix("verdict: ")
    assert doc["fits"] == (v.kind != "does_not_fit") == est.fits
    none = _safe_line(text).endswith("none: it does not fit even one sequence")
    holds = (
        safe["offload_layers"] >= safe["layers_model"]
        if "offload_layers" in safe
        else safe["max_concurrency"] >= 1
    )
    if v.kind == "fits":  # never FITS beside a safe point that holds nothing
        assert holds and not none and est.fits and doc["verdict_detail"]["host"] is None
    if v.kind == "fits_at_estimate":
        assert est.fits and not holds and v.changes and "  safe with: " in text
    if v.kind == "does_not_fit":
        assert est.reasons and all(f"  why: {r}" in text for r in est.reasons)
    if v.kind == "partial_offload":
        host = doc["verdict_detail"]["host"]
        assert host is not None and (host["layers_on_gpu"] < host["layers_total"] or host["experts_on_host"])
        assert "  cost: every token reads about" in text
        if host["layers_on_gpu"] < host["layers_total"]:
            assert f"{host['layers_on_gpu']} of {host['layers_total']} layers on the GPU" in verdict_lines[0]
    if s.engine == "ollama" and est.fits and "ollama" in est.extra:
        o = est.extra["ollama"]
        assert (v.kind == "partial_offload") == (o["layers_offload"] < o["layers_model"])


def test_a_sweep_row_has_the_plans_verdict() -> None:
    spec, gpu = SPECS["llama-3.1-70b-instruct"], get_gpu("h100-80gb")
    base = EngineSettings(tensor_parallel_size=2)
    grid = sweep(spec, gpu, base, [("max_model_len", [2048, 8192, 131072])])
    for row in grid.rows:
        plan = make_plan(spec, gpu, base.with_(max_model_len=row["max_model_len"]))
        assert row["verdict"] == plan.verdict.kind, row


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramlab", "plan", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args,kind,fragment",
    [
        # fits at the estimate, not at the pessimistic end: the term and the safe changes, never "FITS"
        (
            ["--model", "llama-3.1-70b-instruct", "--gpu", "h100-80gb", "-tp", "2", "--max-model-len", "8k"],
            "fits_at_estimate",
            "term's upper band takes the room",
        ),
        (
            ["--model", "qwen2.5-72b-instruct", "--gpu", "a100-80gb", "-tp", "2", "--max-model-len", "16k"],
            "fits_at_estimate",
            "  safe with: ",
        ),
        # Ollama's own partial offload is how it runs a model larger than the card: its own verdict
        (
            [
                "--model",
                "llama-3.1-70b-instruct",
                "--gpu",
                "rtx-4090",
                "--engine",
                "ollama",
                "--engine-version",
                "0.11.6",  # Ollama's own estimator decides the split (0.30+: llama-server's --fit)
                "--quantization",
                "Q4_K_M",
            ],
            "partial_offload",
            "43 of 81 layers on the GPU, 38 on the CPU",
        ),
        # the published phi-4 log: 29 of 41 layers, memory.required.full 9.6 GiB, partial 6.8 GiB
        (
            [
                "--model",
                "phi-4",
                "--gpu-memory-gib",
                "6.9",
                "--engine",
                "ollama",
                "--engine-version",
                "0.5.7",
                "--quantization",
                "Q4_K_M",
            ],
            "partial_offload",
            "29 of 41 layers on the GPU",
        ),
        (
            [
                "--model",
                "qwen3-30b-a3b",
                "--gpu",
                "rtx-4090",
                "--engine",
                "llama.cpp",
                "--quantization",
                "Q4_K_M",
            ]
            + ["-c", "64k", "--n-cpu-moe", "4"],
            "partial_offload",
            "every layer on the GPU except the tensors moved to host memory (--n-cpu-moe 4)",
        ),
        (["--model", "llama-3.1-8b-instruct", "--gpu", "h100-80gb"], "fits", "verdict: FITS with"),
        (
            ["--model", "llama-3.1-8b-instruct", "--gpu", "l4", "--max-model-len", "128k"],
            "does_not_fit",
            "try: ",
        ),
    ],
)
def test_cli_verdict_text_json_and_exit_code_agree(args: list[str], kind: str, fragment: str) -> None:
    text, doc = _cli(*args), _cli(*args, "--json")
    assert text.returncode == doc.returncode == EXIT_CODES[kind], text.stdout + text.stderr
    assert fragment in text.stdout, text.stdout
    assert json.loads(doc.stdout)["verdict"] == kind
    safe = _safe_line(text.stdout)
    if kind != "fits":
        assert "verdict: FITS" not in text.stdout
    else:
        assert not safe.endswith("none: it does not fit even one sequence")
    if kind == "partial_offload" and "ollama" in args:
        # Ollama's per-token KV is this GPU's share, not every layer's
        j = json.loads(doc.stdout)
        per_token = j["kv_cache_bytes"] / (j["settings"]["num_ctx"] * j["settings"]["num_parallel"])
        assert abs(j["kv_bytes_per_token"] - per_token) <= 1
        assert re.search(r"cost: every token reads about [\d.]+ GiB", text.stdout)


# vLLM's spellings of what SGLang names --mem-fraction-static, --context-length, --max-running-requests and
# --chunked-prefill-size: an SGLang sim is given SGLang's own.
VLLM_ONLY_NAMES = {
    "--gpu-memory-utilization",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
}


@pytest.mark.parametrize("name", ["oom-drill.yaml", "cotenant-drill.yaml", "colocation-drill.yaml"])
def test_example_drills_plan_the_sims_own_engine_and_settings_and_fit(name: str) -> None:
    from pathlib import Path

    from vramlab.drill.plan import load_plan
    from vramlab.run.capacity_plan import resolve_facts, target_facts

    root = Path(__file__).resolve().parents[1]
    shipped = root / "src" / "vramlab" / "data" / "examples" / name
    assert shipped.read_text() == (root / "examples" / name).read_text()  # both copies the same
    drill = load_plan(shipped)
    sim = drill.target.sim
    if drill.target.kind != "sim" or sim is None:
        pytest.skip("not a sim drill")
    if sim.engine == "sglang":
        assert not VLLM_ONLY_NAMES & set(sim.extra_args), sim.extra_args
    facts = target_facts(drill.target.model, drill.target.engine, sim, drill.capacity, None)
    spec, card, s = resolve_facts(facts)
    assert s.engine == sim.engine
    extra = list(sim.extra_args)
    # each flag with its value; a switch (--disable-radix-cache) stands alone
    flags = {
        a: (extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("--") else "true")
        for i, a in enumerate(extra)
        if a.startswith("--")
    }
    for flag, field in (
        ("--chunked-prefill-size", "chunked_prefill_size"),
        ("--max-running-requests", "max_num_seqs"),
    ):
        if flag in flags:
            assert getattr(s, field) == int(flags[flag])
    # the sim sizes its memory with the same settings (sim/config.py compute_estimate): the plan it stores is its own
    from vramlab.cli.main import build_parser
    from vramlab.sim.config import SimConfig, compute_estimate

    parser, _ = build_parser("sim")
    args = parser.parse_args(["serve", *sim.argv()])
    cfg = SimConfig(
        model=args.model,
        gpu=args.gpu,
        engine=args.engine,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    plan = make_plan(spec, card, s)
    simulated = compute_estimate(cfg)
    assert (
        simulated.used_bytes == plan.estimate.used_bytes
        and simulated.kv_cache_bytes == plan.estimate.kv_cache_bytes
    )
    if (
        name == "oom-drill.yaml"
    ):  # the demo's drill: its own settings fit its own plan (the co-tenant comes later)
        assert plan.verdict.kind == "fits", plan.verdict.headline
