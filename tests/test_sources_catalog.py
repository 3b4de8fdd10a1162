"""The bundled catalog: complete, unambiguous, sourced, and every entry parses to a sane spec."""

from __future__ import annotations

import pytest

from vramlab.capacity.weights import breakdown
from vramlab.errors import ConfigError, NotFoundError
from vramlab.sources.catalog import load_catalog, parse_catalog

CATALOG = load_catalog()


def test_catalog_is_large_and_names_are_unique():
    assert len(CATALOG) >= 45
    names = [e.name for e in CATALOG]
    assert len(names) == len(set(names))
    assert len({e.hf_id.lower() for e in CATALOG}) == len(CATALOG)


@pytest.mark.parametrize("entry", CATALOG.entries, ids=lambda e: e.name)
def test_every_entry_is_sourced_and_parses(entry):
    assert entry.source.startswith(("https://", "GGUF")) or "file id" in entry.source
    assert entry.family and entry.params_b > 0 and "/" in entry.hf_id
    spec = entry.spec()
    assert spec.source == entry.source and spec.hf_id == entry.hf_id
    assert spec.num_layers > 0 and spec.head_dim > 0 and spec.num_kv_heads <= spec.num_attention_heads


@pytest.mark.parametrize("entry", CATALOG.entries, ids=lambda e: e.name)
def test_architecture_matches_the_published_parameter_count(entry):
    """A typo in a config (a wrong layer count, hidden size, expert count) moves the count a lot."""
    params_b = breakdown(entry.spec()).total_params / 1e9
    assert params_b == pytest.approx(entry.params_b, rel=0.08)


def test_required_coverage_of_families_and_kinds():
    specs = {e.name: e.spec() for e in CATALOG}
    for name in (
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "llama-3.2-1b-instruct",
        "llama-3.2-3b-instruct",
        "llama-3.1-8b-instruct",
        "llama-3.3-70b-instruct",
        "llama-3.1-405b-instruct",
        "llama-4-scout-17b-16e-instruct",
        "qwen2.5-0.5b-instruct",
        "qwen2.5-72b-instruct",
        "qwen3-0.6b",
        "qwen3-32b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "mistral-7b-instruct-v0.3",
        "mistral-small-3.1-24b-instruct",
        "mixtral-8x7b-instruct",
        "mixtral-8x22b-instruct",
        "gemma-2-2b-it",
        "gemma-2-27b-it",
        "gemma-3-1b-it",
        "gemma-3-27b-it",
        "phi-3-mini-4k-instruct",
        "phi-3-medium-4k-instruct",
        "phi-4",
        "deepseek-v2-lite-chat",
        "deepseek-v3",
        "deepseek-r1",
        "deepseek-r1-distill-qwen-7b",
        "deepseek-r1-distill-qwen-32b",
        "deepseek-r1-distill-llama-8b",
        "deepseek-r1-distill-llama-70b",
        "gpt-oss-20b",
        "gpt-oss-120b",
        "qwen2.5-72b-instruct-awq",
    ):
        assert name in specs, name
    assert specs["deepseek-v3"].is_mla and specs["deepseek-v3"].num_experts == 256
    assert specs["qwen3-30b-a3b"].is_moe and specs["qwen3-30b-a3b"].head_dim == 128
    assert specs["gemma-3-27b-it"].count("sliding") == 52 and specs["gemma-3-27b-it"].count("full") == 10
    assert specs["gpt-oss-20b"].kinds[:2] == ("sliding", "full")
    assert specs["llama-4-scout-17b-16e-instruct"].count("chunked") == 36
    assert any(s.is_hybrid and {"mamba", "linear"} & set(s.kinds) for s in specs.values())
    assert specs["gemma-3-4b-it"].vision_params > 0  # text_config + vision_config read


def test_quantized_variants_carry_real_quantization_configs():
    methods = {e.quantization_config["quant_method"] for e in CATALOG if e.is_quantized}
    assert {"awq", "gptq", "fp8", "bitsandbytes", "compressed-tensors", "mxfp4"} <= methods
    awq = CATALOG.get("qwen2.5-72b-instruct-awq")
    assert awq.quantization_config == {
        "bits": 4,
        "group_size": 128,
        "modules_to_not_convert": None,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    }
    spec = awq.spec()
    assert spec.quant is not None
    assert spec.quant.method == "awq" and spec.quant.bits == 4 and spec.quant.group_size == 128
    assert CATALOG.get("llama-3.3-70b-instruct-fp8-dynamic").quant_label == "fp8"
    assert CATALOG.get("llama-3.1-8b-instruct-w4a16").quant_label == "w4a16-int4"
    assert CATALOG.get("llama-3.1-8b-instruct-bnb-4bit").quant_label == "bnb-nf4"


@pytest.mark.parametrize(
    "key",
    [
        "llama-3.1-8b-instruct",
        "LLAMA-3.1-8B-INSTRUCT",
        "llama3.1-8b",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/llama-3.1-8b-instruct",
        "Llama-3.1-8B-Instruct",
        "  llama-3.1-8b-instruct ",
    ],
)
def test_lookup_by_name_alias_hub_id_and_repo_name(key):
    assert CATALOG.get(key).name == "llama-3.1-8b-instruct"


def test_unknown_name_suggests_near_matches():
    with pytest.raises(NotFoundError, match="did you mean 'qwen3-8b'"):
        CATALOG.get("qwen3-8")


def test_filter():
    qwen_q = CATALOG.filter(family="QWEN", quantized=True)
    assert qwen_q and all(e.family == "qwen" and e.is_quantized for e in qwen_q)
    assert all(not e.is_quantized for e in CATALOG.filter(quantized=False))
    small = CATALOG.filter(max_params_b=2)
    assert small and all(e.params_b <= 2 for e in small)
    assert {e.name for e in CATALOG.filter(text="gpt-oss")} == {"gpt-oss-20b", "gpt-oss-120b"}
    assert CATALOG.filter(min_params_b=600, family="deepseek")
    assert CATALOG.filter(text="no-such-model") == []


def test_malformed_catalogs_are_config_errors():
    with pytest.raises(ConfigError, match="JSON list"):
        parse_catalog({"name": "x"})
    with pytest.raises(ConfigError, match="missing source"):
        parse_catalog([{"name": "x", "hf_id": "a/x", "family": "f", "params_b": 1, "config": {}}])
    ok = {"name": "x", "hf_id": "a/x", "family": "f", "params_b": 1, "source": "s", "config": {}}
    with pytest.raises(ConfigError, match="names both"):
        parse_catalog([ok, {**ok, "name": "y", "hf_id": "a/y", "aliases": ["X"]}])
