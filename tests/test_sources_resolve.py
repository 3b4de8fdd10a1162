"""resolve_model: catalog names and Hub ids offline, local directories and config files."""

from __future__ import annotations

import json

import pytest

from _sources_files import TINY_LLAMA_CONFIG, tiny_llama_bytes, write_sharded_model
from vramlab.errors import ConfigError, NotFoundError
from vramlab.sources import resolve_model
from vramlab.sources.catalog import get_entry


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: any request would fail
    monkeypatch.setenv("VRAMLAB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"])
def test_catalog_names_and_hub_ids_resolve_offline(name):
    spec = resolve_model(name)
    assert spec.name == "llama-3.1-8b-instruct"
    assert spec.source == get_entry("llama-3.1-8b-instruct").source
    assert spec.hf_id == "meta-llama/Llama-3.1-8B-Instruct"


def test_directory_with_shards_gives_exact_weights(tmp_path):
    write_sharded_model(tmp_path / "my-model")
    spec = resolve_model(str(tmp_path / "my-model"))
    assert spec.name == "my-model" and spec.weights_bytes_exact == tiny_llama_bytes()
    assert spec.weights_bytes_by_dtype == {"BF16": tiny_llama_bytes()}
    assert spec.weights_source == "safetensors headers" and str(tmp_path / "my-model") in spec.source
    # The index file or a shard path point at the same model.
    assert resolve_model(str(tmp_path / "my-model" / "model.safetensors.index.json")) == spec


def test_config_json_alone_and_vlm_text_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    spec = resolve_model(str(tmp_path / "config.json"))
    assert spec.weights_bytes_exact is None and spec.num_layers == 2
    vlm = {
        "architectures": ["X"],
        "model_type": "x",
        "text_config": dict(TINY_LLAMA_CONFIG, num_hidden_layers=5),
        "vision_config": {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64},
    }
    (tmp_path / "vlm.json").write_text(json.dumps(vlm))
    spec = resolve_model(str(tmp_path / "vlm.json"))
    assert spec.num_layers == 5 and spec.vision_params > 0


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(NotFoundError, match="did you mean 'qwen3-8b'"):
        resolve_model("qwen3-8bb")
    with pytest.raises(ConfigError, match="--offline"):
        resolve_model("someone/unknown-model")
    with pytest.raises(ConfigError, match="no such file"):
        resolve_model("./missing.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ConfigError, match="not valid JSON"):
        resolve_model(str(tmp_path / "bad.json"))
    (tmp_path / "nolayers.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        resolve_model(str(tmp_path / "nolayers.json"))
    with pytest.raises(ConfigError):
        resolve_model("")
