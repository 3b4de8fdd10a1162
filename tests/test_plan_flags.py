"""`vramlab plan` through the installed command: flags of another engine, placement inputs and names that would be
planned wrongly without a word are refused in one line with exit 2; -ot patterns are matched in linear time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

VRAMLAB = Path(sys.executable).with_name("vramlab")


def plan(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [str(VRAMLAB)] if VRAMLAB.exists() else [sys.executable, "-m", "vramlab"]
    return subprocess.run([*cmd, "plan", *args], capture_output=True, text=True, timeout=timeout)


def one_line_refusal(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr


QWEN = ["--model", "qwen3-8b", "--gpu", "rtx-4090"]
LLAMACPP = [*QWEN, "--engine", "llama.cpp"]


@pytest.mark.parametrize(
    "args,fragments",
    [
        # another engine's flags: every one named, with the engine that reads them
        (
            [*QWEN, "--ctx-size", "8k", "--no-mmap"],
            [
                "--ctx-size (llama.cpp); --no-mmap (llama.cpp)",
                "not read by the vLLM plan",
                "--engine llama.cpp",
            ],
        ),
        (
            [*LLAMACPP, "--mem-fraction-static", "0.8", "--enforce-eager"],
            ["--enforce-eager (vLLM, SGLang, TGI)", "--mem-fraction-static (SGLang)", "llama.cpp plan"],
        ),
        ([*QWEN, "--engine", "sglang", "--kv-cache-memory", "8GiB"], ["--kv-cache-memory (vLLM)"]),
        ([*QWEN, "--engine", "ollama", "-tp", "2"], ["--tensor-parallel-size", "--gpu A,B", "Ollama plan"]),
        (
            [*QWEN, "-ngl", "10"],
            ["--n-gpu-layers (llama.cpp, Ollama)", "--engine llama.cpp or --engine ollama"],
        ),
        ([*QWEN, "--sweep", "mem-fraction-static=0.5,0.6"], ["--sweep mem-fraction-static", "vLLM plan"]),
        # tensor splits llama.cpp could not use
        ([*LLAMACPP, "-ts", "1e308,1e308"], ["--tensor-split", "finite number above 0"]),
        ([*LLAMACPP, "-ts", "nan"], ["--tensor-split", "finite number >= 0, got nan"]),
        ([*LLAMACPP, "-ts", "inf,1"], ["--tensor-split", "got inf"]),
        ([*LLAMACPP, "-ts=-1,2"], ["--tensor-split", "got -1.0"]),
        ([*LLAMACPP, "-ts", "0,0"], ["--tensor-split", "above 0"]),
        # quantization names, per engine
        ([*LLAMACPP, "--quantization", "Q9_Z"], ["'Q9_Z': not a GGUF file type", "did you mean"]),
        ([*QWEN, "--quantization", "Q9_Z"], ["'Q9_Z': not a quantization method vramlab knows for vllm"]),
        (
            [*QWEN, "--engine", "ollama", "--quantization", "awq"],
            ["not a GGUF file type vramlab knows for ollama"],
        ),
        # -ngl: ASCII digits only, and a count, not a 5,000-digit number (both were exit 70)
        ([*LLAMACPP, "-ngl", "²"], ["--n-gpu-layers", "got '²'"]),
        ([*LLAMACPP, "-ngl", "9" * 5000], ["--n-gpu-layers", "(5000 characters)"]),
        ([*QWEN, "--max-model-len", "9" * 400], ["not a count vramlab plans"]),
        # -ot: RE2 refuses what it cannot match in linear time, and says why
        ([*LLAMACPP, "-ot", r"(a)\1=CPU"], ["--override-tensor", "RE2 syntax: no backreferences"]),
        ([*LLAMACPP, "-ot", "(?=blk)=CPU"], ["--override-tensor", "look-arounds"]),
    ],
)
def test_refused_in_one_line(args: list[str], fragments: list[str]) -> None:
    one_line_refusal(plan(*args), *fragments)


def test_accepted_names_still_plan() -> None:
    two_cards = ["--model", "qwen3-8b", "--gpu", "rtx-4090,rtx-3090", "--engine", "llama.cpp"]
    for args in ([*QWEN, "--quantization", "awq"], [*two_cards, "--quantization", "q4_k_m", "-ts", "3,1"]):
        r = plan(*args)
        assert r.returncode in (0, 1, 3, 4) and "verdict: " in r.stdout, r.stderr


def test_ot_patterns_are_linear_time_and_many_are_fast() -> None:
    moe = [
        "--model",
        "qwen3-30b-a3b",
        "--gpu",
        "rtx-4090",
        "--engine",
        "llama.cpp",
        "--quantization",
        "Q4_K_M",
    ]
    # a backtracking pattern that Python's re (and std::regex) take exponential time on: RE2 answers at once
    r = plan(*moe, "-ot", "^(.+)+!=CPU", timeout=30)
    assert r.returncode in (0, 1, 3, 4) and "verdict: " in r.stdout, r.stderr
    many = [f"-ot=blk\\.{i % 48}\\.ffn_up_exps=CPU" for i in range(1000)]
    r = plan(*moe, *many, timeout=30)  # 44 s when each pattern was searched on its own
    assert r.returncode == 4 and "verdict: RUNS WITH PART OF THE MODEL ON THE CPU" in r.stdout, r.stderr
    one_line_refusal(plan(*moe, "-ot", ",".join(["x=CPU"] * 4097), timeout=30), "more than 4,096 patterns")


def test_ollama_says_where_the_layers_went_when_a_card_holds_none() -> None:
    r = plan(
        "--model",
        "qwen3-8b",
        "--gpu",
        "rtx-3070,rtx-4090,rtx-3070",
        "--engine",
        "ollama",
        "--quantization",
        "Q4_K_M",
        "--max-model-len",
        "32k",
        "--engine-version",
        "0.11.6",  # Ollama's own estimator (llm/memory.go) decides the split; 0.30+ runs llama-server's --fit
    )
    assert r.returncode == 0, r.stdout + r.stderr
    note = next(line for line in r.stdout.splitlines() if "hold no layer of the model" in line)
    assert "card 0 (rtx-3070), card 2 (rtx-3070)" in note and "37 on card 1 (rtx-4090)" in note
    assert "the component table above is card 0's" in note
    # card 0 holds nothing: its graph is not charged to it either
    act = next(line for line in r.stdout.splitlines() if line.startswith("activation_peak"))
    assert act.split()[1] == "0.00"
