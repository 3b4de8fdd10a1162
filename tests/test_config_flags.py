"""Typed booleans in a model's config.json: a JSON boolean is read as itself, anything else in a
true/false field ("False", "false", 0, "no", a list) is refused with the field's name. A string is
truthy in Python, so reading `"tie_word_embeddings": "False"` as-is would count the embeddings
once and under-predict the weights by the LM head (about 1 GiB on an 8B model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramlab.capacity.validation import CONFIG_FLAGS, QUANT_FLAGS
from vramlab.errors import ConfigError
from vramlab.sources.hf_config import spec_from_config

ROOT = Path(__file__).resolve().parent.parent
CONFIGS: dict[str, dict[str, Any]] = {
    m["name"]: m["config"]
    for m in json.loads((ROOT / "src" / "vramlab" / "data" / "models.json").read_text())
    if isinstance(m.get("config"), dict)
}
LLAMA = CONFIGS["llama-3.1-8b-instruct"]

not_booleans = st.one_of(
    st.sampled_from(["False", "false", "True", "true", "0", "1", "no", "yes", "", "off", "null"]),
    st.text(max_size=8),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.booleans(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.booleans(), max_size=2),
)


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.sampled_from(sorted(CONFIGS)), st.sampled_from(CONFIG_FLAGS), not_booleans)
def test_a_non_boolean_in_a_flag_is_refused_by_name(name: str, flag: str, value: Any) -> None:
    config = {**CONFIGS[name], flag: value}
    with pytest.raises(ConfigError, match=f"'{flag}' must be true or false"):
        spec_from_config(config, name, "fuzz")


@settings(max_examples=100, derandomize=True, deadline=None, database=None)
@given(st.sampled_from(QUANT_FLAGS), not_booleans)
def test_a_non_boolean_in_a_quantization_flag_is_refused_by_name(flag: str, value: Any) -> None:
    config = {
        **LLAMA,
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, flag: value},
    }
    with pytest.raises(ConfigError, match=f"'quantization_config.{flag}' must be true or false"):
        spec_from_config(config, "llama", "fuzz")


@pytest.mark.parametrize("value", [True, False])
def test_a_json_boolean_is_read_as_itself(value: bool) -> None:
    spec = spec_from_config({**LLAMA, "tie_word_embeddings": value}, "llama", "test")
    assert spec.tie_word_embeddings is value


def test_the_string_false_never_shrinks_the_weights() -> None:
    from vramlab.capacity import EngineSettings, estimate, get_gpu

    untied = spec_from_config({**LLAMA, "tie_word_embeddings": False}, "llama", "test")
    tied = spec_from_config({**LLAMA, "tie_word_embeddings": True}, "llama", "test")
    gpu, s = get_gpu("h100-80gb"), EngineSettings(engine="vllm", max_model_len=8192)
    assert estimate(untied, gpu, s).weights_bytes > estimate(tied, gpu, s).weights_bytes  # the flag matters
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        spec_from_config({**LLAMA, "tie_word_embeddings": "False"}, "llama", "test")
