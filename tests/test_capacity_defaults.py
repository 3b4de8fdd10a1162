"""The defaults each engine derives (capacity/defaults.py), held against each engine's rule at its release.

The catalog test pins, by hand, the context of every catalog model whose config carries a rope-scaling
factor (the only place the engines disagree); every other model must plan its raw max_position_embeddings,
read from the catalog's JSON, not from the code under test.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vramlab.capacity import estimate, get_gpu
from vramlab.capacity.defaults import default_context, derived_context
from vramlab.capacity.settings import EngineSettings
from vramlab.sources.catalog import load_catalog

H100 = get_gpu("h100-80gb")
CATALOG = load_catalog()

# Hand-derived from each config's rope_scaling (see docs/capacity-model.md, "Derived defaults"):
# (vLLM >= 0.8, vLLM 0.7, SGLang, TGI / llama.cpp).
LLAMA3_128K = (
    131072,
    131072,
    131072,
    131072,
)  # rope_type llama3: max_position_embeddings is the extended length
PINNED = {
    **{
        name: LLAMA3_128K
        for name in (
            "llama-3.1-8b-instruct",
            "llama-3.1-70b-instruct",
            "llama-3.1-405b-instruct",
            "llama-3.2-1b-instruct",
            "llama-3.2-3b-instruct",
            "llama-3.3-70b-instruct",
            "deepseek-r1-distill-llama-8b",
            "deepseek-r1-distill-llama-70b",
            "llama-3.1-8b-instruct-awq",
            "llama-3.3-70b-instruct-fp8-dynamic",
            "llama-3.3-70b-instruct-w8a8",
            "llama-3.1-8b-instruct-w4a16",
            "llama-3.1-8b-instruct-w8a8",
            "llama-3.1-8b-instruct-bnb-4bit",
            "llama-3.1-8b-instruct-unsloth-bnb-4bit",
            "llama-3.3-70b-instruct-fp4",
        )
    },
    "llama-4-scout-17b-16e-instruct": (10485760,) * 4,
    # linear x8 over 131072: vLLM skips the factor for "gemma3" model types (from 0.8.0, with Gemma 3 support);
    # SGLang's get_context_length has no such exception; TGI's launcher reads the raw field.
    **{
        name: (131072, 1048576, 1048576, 131072)
        for name in ("gemma-3-4b-it", "gemma-3-12b-it", "gemma-3-27b-it")
    },
    # yarn x40 from original 4096 = 163840 (vLLM); SGLang keeps max_position_embeddings when the dict names
    # original_max_position_embeddings.
    **{name: (163840,) * 4 for name in ("deepseek-v2-lite-chat", "deepseek-v3", "deepseek-r1")},
    **{name: (131072,) * 4 for name in ("gpt-oss-20b", "gpt-oss-120b")},  # yarn x32 from 4096
    "kimi-k2-instruct": (131072,) * 4,  # yarn x32 from 4096 = its max_position_embeddings 131072
}


def _raw(entry) -> tuple[int, float]:
    """(max_position_embeddings, rope factor) straight from the catalog JSON."""
    cfg = entry.config
    text = cfg.get("text_config") or cfg
    mpe = text.get("max_position_embeddings") or cfg.get("max_position_embeddings") or 0
    rope = text.get("rope_scaling") or cfg.get("rope_scaling") or {}
    return int(mpe), float(rope.get("factor") or 1.0)


@pytest.mark.parametrize("name", CATALOG.names)
def test_every_catalog_model_derives_its_era_rules_context(name: str) -> None:
    entry = CATALOG.get(name)
    spec = entry.spec()
    mpe, factor = _raw(entry)
    if name in PINNED:
        want = PINNED[name]
    else:
        assert factor <= 1, f"{name} has a rope factor {factor}: pin its context in PINNED by hand"
        want = (mpe,) * 4
    got = (
        derived_context(spec, "vllm", (0, 10, 1)).tokens,
        derived_context(spec, "vllm", (0, 7, 3)).tokens,
        derived_context(spec, "sglang", (0, 5, 6)).tokens,
        derived_context(spec, "tgi", (3, 3, 6)).tokens,
    )
    assert got == want
    assert derived_context(spec, "llama.cpp").tokens == want[3]
    assert derived_context(spec, "transformers").tokens == want[0]


@pytest.mark.parametrize("name", ["gemma-3-4b-it", "gemma-3-12b-it", "gemma-3-27b-it"])
def test_gemma3_plans_vllms_131072_and_the_text_agrees(name: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vramlab", "plan", "--model", name, "--gpu", "h100-80gb"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 1, 3), out.stderr  # fits, does not fit, fits at the estimate only
    text = out.stdout
    assert "max_model_len=131072" in text
    assert "max concurrency at 131,072 tokens" in text
    assert "1,048,576" not in text and "1048576" not in text
    safe = next(line for line in text.splitlines() if line.startswith("safe operating point"))
    assert "at 131,072 tokens" in safe
    assert "Gemma 3's is already scaled" in text


def test_tgi_2x_caps_the_default_and_3x_does_not() -> None:
    spec = CATALOG.get("llama-3.1-8b-instruct").spec()
    assert default_context(spec, EngineSettings(engine="tgi", engine_version="2.4.1")) == 4096
    assert default_context(spec, EngineSettings(engine="tgi", engine_version="1.4.5")) == 2048
    assert default_context(spec, EngineSettings(engine="tgi", engine_version="3.3.6")) == 131072
    est = estimate(spec, H100, EngineSettings(engine="tgi", engine_version="2.4.1"))
    assert est.max_model_len == 4096
    assert any("caps its default there; the config gives 131,072" in n for n in est.notes)


def test_a_given_length_or_a_rope_override_wins() -> None:
    spec = CATALOG.get("gemma-3-27b-it").spec()
    assert derived_context(spec, "vllm", (0, 10), rope_factor=2.0).tokens == 262144
    est = estimate(spec, H100, EngineSettings(max_model_len=8192))
    assert est.max_model_len == 8192
    assert not any(n.startswith("max_model_len") for n in est.notes)  # no default was derived


def test_safe_point_and_suggestions_search_up_to_the_engines_context() -> None:
    """The safe point reads the length the policy resolved and the longest-fit search stops at the derived
    context: on SGLang a Gemma 3 plan searches up to SGLang's own 1,048,576, on vLLM up to 131,072."""
    from vramlab.capacity import max_len_that_fits, safe_operating_point

    spec = CATALOG.get("gemma-3-4b-it").spec()
    vllm = EngineSettings(engine_version="0.10.1")
    assert safe_operating_point(spec, H100, vllm)["max_model_len"] == 131072
    assert max_len_that_fits(spec, H100, vllm.with_(max_model_len=None), concurrency=1) == 131072
    sglang = EngineSettings(engine="sglang", engine_version="0.5.6")
    assert safe_operating_point(spec, H100, sglang)["max_model_len"] == 1048576


def test_the_json_and_the_sweep_read_the_same_default() -> None:
    base = [
        sys.executable,
        "-m",
        "vramlab",
        "plan",
        "--model",
        "gemma-3-27b-it",
        "--gpu",
        "h100-80gb",
        "--json",
    ]
    plan = json.loads(subprocess.run(base, capture_output=True, text=True, timeout=120).stdout)
    assert plan["max_model_len"] == 131072 and plan["settings"]["max_model_len"] == 131072
    assert "Gemma 3's is already scaled" in plan["default_context_rule"]
    assert plan["safe_operating_point"]["max_model_len"] == 131072
    swept = json.loads(
        subprocess.run(
            [*base, "--sweep", "kv-cache-dtype=auto,fp8"], capture_output=True, text=True, timeout=120
        ).stdout
    )
    auto = next(r for r in swept["rows"] if r["kv_cache_dtype"] == "auto")
    # the sweep's concurrency is the plan's: the pool over the same 131,072-token default
    assert auto["max_concurrency"] == round(plan["max_concurrency"], 2)
    assert auto["kv_cache_tokens"] == plan["kv_cache_tokens"]


def test_sglang_starts_with_a_pool_shorter_than_its_derived_context() -> None:
    """SGLang derives 1,048,576 for Gemma 3 and does not refuse a shorter pool: its scheduler caps a request at
    min(context_len, pool) - 1 tokens. The plan fits and says the cap."""
    spec = CATALOG.get("gemma-3-27b-it").spec()
    est = estimate(spec, H100, EngineSettings(engine="sglang", engine_version="0.5.6"))
    assert est.max_model_len == 1048576 and 0 < est.kv_cache_tokens < 1048576
    assert est.fits, est.reasons
    cap = next(n for n in est.notes if "caps each request" in n)
    assert f"at {est.kv_cache_tokens - 1:,} tokens (max_req_len)" in cap


def test_tgi_3x_sets_max_total_tokens_to_its_warm_up_batch() -> None:
    """Without --max-total-tokens TGI 3.x's warm-up sets it to the warm-up batch's tokens, the prefill default: a
    gemma-3-27b-it start-up on two RTX A6000 printed "Maximum total tokens defaulted to 8000", its prefill default."""
    vlm = estimate(
        CATALOG.get("gemma-3-27b-it").spec(),
        get_gpu("rtx-a6000"),
        EngineSettings(engine="tgi", engine_version="3.3.6", tensor_parallel_size=2),
    )
    assert vlm.max_model_len == vlm.settings["max_batch_prefill_tokens"] == 8000
    assert any("sets max_total_tokens at warm-up" in n for n in vlm.notes)
    text = estimate(
        CATALOG.get("llama-3.1-8b-instruct").spec(),
        get_gpu("l4"),
        EngineSettings(engine="tgi", engine_version="3.3.6"),
    )
    assert text.max_model_len == text.settings["max_batch_prefill_tokens"] < 131072
    given = estimate(
        CATALOG.get("llama-3.1-8b-instruct").spec(),
        get_gpu("l4"),
        EngineSettings(engine="tgi", engine_version="3.3.6", max_model_len=131072),
    )
    assert not given.fits  # a given --max-total-tokens above the pool is TGI's NotEnoughMemory
    old = estimate(
        CATALOG.get("llama-3.1-8b-instruct").spec(),
        get_gpu("l4"),
        EngineSettings(engine="tgi", engine_version="2.4.1"),
    )
    assert old.max_model_len == 4096  # 2.x: the launcher's cap, not the warm-up
