"""The sliding window as each engine and release treats it when it derives the context (capacity/defaults.py).

vLLM: `--disable-sliding-window` caps the derived context at the window and makes every layer full attention;
0.5.1-0.6.4 forced that on Gemma 2; through 0.11 a rope factor with the window off refuses to start. SGLang and
TGI never cap the context at the window; TGI 2.1.0-2.4.0 refuses a windowed model on a backend without windowed
attention when its max_input_tokens exceeds the window. The expected numbers are the configs' own fields, pinned
by hand; the tests call the planner.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vramlab.capacity import estimate, get_gpu
from vramlab.capacity.defaults import default_context, derived_context
from vramlab.capacity.settings import EngineSettings
from vramlab.errors import ConfigError
from vramlab.sources.catalog import load_catalog
from vramlab.sources.hf_config import spec_from_config

CATALOG = load_catalog()
H100, A10G, T4, MI300X = (get_gpu(n) for n in ("h100-80gb", "a10g", "t4", "mi300x"))
# mistralai/Mistral-7B-v0.1's config.json (not in the catalog): a 4096 window on every layer, 32768 positions.
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "rope_theta": 10000.0,
    "vocab_size": 32000,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def model(name: str):
    return CATALOG.get(name).spec()


def vllm(version: str, disable: bool = False, **kw: object) -> EngineSettings:
    return EngineSettings(engine_version=version, disable_sliding_window=disable, **kw)  # type: ignore[arg-type]


# (model, release, window off, the context vLLM derives)
VLLM_CONTEXTS = [
    ("gemma-2-9b-it", "0.5.1", False, 4096),  # Gemma 2 support came with the forced cap (PR #5908)
    ("gemma-2-9b-it", "0.6.4", False, 4096),
    ("gemma-2-9b-it", "0.6.5", False, 8192),  # PR #10584: full context, the window used in attention only
    ("gemma-2-9b-it", "0.10.2", False, 8192),
    ("gemma-2-9b-it", "0.10.2", True, 4096),
    ("gemma-2-27b-it", "0.29.0", True, 4096),
    ("gemma-3-27b-it", "0.10.2", False, 131072),
    ("gemma-3-27b-it", "0.10.2", True, 1024),  # Gemma 3 skips its rope factor, so no rope refusal either
    ("gemma-3-27b-it", "0.29.0", True, 1024),
    ("gemma-3-1b-it", "0.29.0", True, 512),
    ("gpt-oss-20b", "0.10.2", False, 131072),
    ("gpt-oss-20b", "0.29.0", True, 131072),  # yarn restarts from original_max_position_embeddings 4096 x 32
    ("qwen2-7b-instruct", "0.29.0", True, 32768),  # use_sliding_window: false -- no window to cap at
]


@pytest.mark.parametrize(("name", "version", "disable", "tokens"), VLLM_CONTEXTS)
def test_vllm_derives_each_releases_context_for_windowed_catalog_models(
    name, version, disable, tokens
) -> None:
    spec = model(name)
    assert default_context(spec, vllm(version, disable)) == tokens
    assert estimate(spec, H100, vllm(version, disable)).max_model_len == tokens


def test_mistral_7b_v01_keeps_32768_unless_the_window_is_disabled() -> None:
    spec = spec_from_config(MISTRAL_7B_V01, "mistral-7b-v0.1", "tests/test_capacity_sliding_window.py")
    assert spec.sliding_window == 4096
    for version in ("0.6.3", "0.10.2", "0.29.0"):
        assert default_context(spec, vllm(version)) == 32768
        assert default_context(spec, vllm(version, True)) == 4096
    rule = derived_context(spec, "vllm", (0, 29), disable_sliding_window=True).rule
    assert "capped at the sliding window 4,096" in rule and "--disable-sliding-window" in rule


def test_qwen2_use_sliding_window_false_means_no_window_for_vllm_to_cap_at() -> None:
    config = {**CATALOG.get("qwen2-7b-instruct").config, "sliding_window": 4096}
    off = spec_from_config({**config, "use_sliding_window": False}, "qwen2-off", "tests")
    on = spec_from_config({**config, "use_sliding_window": True}, "qwen2-on", "tests")
    assert off.sliding_window is None and on.sliding_window == 4096
    assert default_context(off, vllm("0.29.0", True)) == 32768
    assert default_context(on, vllm("0.29.0", True)) == 4096


@pytest.mark.parametrize("version", ["0.10.2", "0.11.0"])
def test_vllm_up_to_0_11_refuses_the_window_off_with_a_rope_factor(version: str) -> None:
    with pytest.raises(
        ConfigError, match="Disabling sliding window is not supported for models with rope_scaling"
    ):
        estimate(model("gpt-oss-20b"), H100, vllm(version, True))


def test_sglang_and_tgi_never_cap_the_context_at_the_window() -> None:
    for name, tokens in (("gemma-2-9b-it", 8192), ("gemma-3-1b-it", 32768), ("gpt-oss-20b", 131072)):
        spec = model(name)
        assert derived_context(spec, "sglang", (0, 5, 6)).tokens == tokens
        assert derived_context(spec, "tgi", (3, 3, 6)).tokens == spec.max_position_embeddings
        # the vLLM-only flag has no say over the other engines' rule
        assert derived_context(spec, "sglang", (0, 5, 6), disable_sliding_window=True).tokens == tokens


def test_window_off_sizes_every_layer_as_full_attention() -> None:
    spec = model("gemma-3-27b-it")
    kept = estimate(spec, H100, vllm("0.29.0", max_model_len=1024))
    off = estimate(spec, H100, vllm("0.29.0", True))
    assert kept.extra["hybrid_groups"] == [["sliding", 6], ["full", 1]]  # 52 sliding, 10 full layers
    assert off.extra["hybrid_groups"] == [["full", 1]]
    assert off.max_model_len == 1024
    assert any("sliding window off (--disable-sliding-window)" in n for n in off.notes)
    # the whole model's per-token KV is the same; only the grouping (and so the sliding layers' cap) changes
    assert off.kv_bytes_per_token == kept.kv_bytes_per_token
    forced = estimate(model("gemma-2-9b-it"), H100, vllm("0.6.4"))
    assert any("0.5.1-0.6.4 turns Gemma 2's sliding window off" in n for n in forced.notes)


def test_tgi_2x_refuses_a_window_above_max_input_on_a_backend_without_windowing() -> None:
    small = model("gemma-3-1b-it")  # sliding_window 512, top-level in its config
    refused = estimate(small, T4, EngineSettings(engine="tgi", engine_version="2.2.0"))
    assert any(
        "does not support sliding window attention" in r and "max_input_tokens 4,095" in r
        for r in refused.reasons
    )
    assert not refused.fits
    rocm = estimate(small, MI300X, EngineSettings(engine="tgi", engine_version="2.2.0"))
    assert any("ROCm backend does not support sliding window" in r for r in rocm.reasons)
    for gpu, settings in (
        (A10G, EngineSettings(engine="tgi", engine_version="2.2.0")),  # flash-attn v2
        (T4, EngineSettings(engine="tgi", engine_version="3.3.6")),  # max_input_tokens not passed
        (T4, EngineSettings(engine="tgi", engine_version="2.0.4")),  # before the check
        (T4, EngineSettings(engine="tgi", engine_version="2.2.0", max_model_len=513)),
    ):
        plan = estimate(small, gpu, settings)
        assert not any("sliding window" in r for r in plan.reasons), (gpu.name, settings)
    # Gemma 2's 4096 window is not below the 2.x default max_input_tokens 4095; Gemma 3 27B keeps its window in
    # text_config, where the server's top-level read does not look
    for name in ("gemma-2-9b-it", "gemma-3-27b-it"):
        plan = estimate(model(name), T4, EngineSettings(engine="tgi", engine_version="2.2.0"))
        assert not any("sliding window" in r for r in plan.reasons), name


VRAMLAB = shutil.which("vramlab", path=str(Path(sys.executable).parent)) or "vramlab"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([VRAMLAB, "plan", *args], capture_output=True, text=True, timeout=120, env=env)


def test_cli_disable_sliding_window_caps_the_plan() -> None:
    out = run("--model", "gemma-2-9b-it", "--gpu", "h100-80gb", "--disable-sliding-window")
    assert out.returncode in (0, 1), out.stderr
    assert "max_model_len=4096" in out.stdout
    assert "capped at the sliding window 4,096 (--disable-sliding-window" in out.stdout
    assert "max_model_len=8192" in run("--model", "gemma-2-9b-it", "--gpu", "h100-80gb").stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ("--model", "gemma-2-9b-it", "--engine", "sglang", "--disable-sliding-window"),
            "--disable-sliding-window (vLLM): not read by the SGLang plan",
        ),
        (
            ("--model", "gpt-oss-20b", "--engine-version", "0.10.2", "--disable-sliding-window"),
            "rope_scaling",
        ),
        (
            ("--model", "gemma-2-9b-it", "--disable-sliding-window", "--max-model-len", "8192"),
            "sliding window 4,096",
        ),
    ],
)
def test_cli_bad_sliding_window_input_is_one_line_and_exit_2(args, fragment) -> None:
    out = run(*args, "--gpu", "h100-80gb")
    assert out.returncode == 2, out.stdout
    assert fragment in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
