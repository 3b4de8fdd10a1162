"""One entry point for model facts: `resolve_model(text)` whatever the user typed.

Order: an existing path (directory, `config.json`, `.gguf`) is read as such; then the bundled
catalog (short name, alias or Hub id, all offline); then a Hub id is fetched (online only).
Anything else is an unknown model, with near matches from the catalog.
"""

from __future__ import annotations

import json
from pathlib import Path

from vramlab.capacity.spec import ModelSpec
from vramlab.errors import ConfigError, unknown
from vramlab.infile import exists


def resolve_model(
    name_or_path: str,
    *,
    offline: bool = True,
    revision: str | None = None,
    online_hint: str = "run without --offline",
) -> ModelSpec:
    """A `ModelSpec` for a catalog name/alias/Hub id, a local directory/config.json/.gguf, or a Hub id.

    Catalog entries and local files resolve offline. A Hub id outside the catalog needs
    `offline=False` (and a network, or an earlier fetch in the cache). *online_hint* is how the
    caller's user turns the Hub on (`plan`: leave out --offline; `models`: pass --online), named in
    the message when offline mode stops the lookup.
    """
    text = (name_or_path or "").strip()
    if not text:
        raise ConfigError("no model given")
    path = Path(text).expanduser()
    if exists(path):
        return spec_from_path(path)

    from vramlab.sources.catalog import load_catalog

    catalog = load_catalog()
    entry = catalog.find(text)
    if entry is not None and revision is None:
        return entry.spec()

    from vramlab.sources.hub import env_offline, looks_like_repo_id

    if looks_like_repo_id(text):
        from vramlab.sources.hub import HubClient

        client = HubClient(offline=offline or env_offline(), online_hint=online_hint)
        if client.offline and not _cached(client, text, revision):
            raise ConfigError(
                f"{text!r} is not in the bundled catalog and offline mode is on; {online_hint} "
                "to read its config and safetensors headers from the Hugging Face Hub"
                + ("" if not env_offline() else " (and unset HF_HUB_OFFLINE)")
            )
        return client.spec(text, revision)
    if text.endswith((".gguf", ".json", ".safetensors")) or "/" in text or text.startswith("."):
        raise ConfigError(f"{text}: no such file or directory")
    raise unknown("model", text, catalog.names)


def _cached(client: object, repo: str, revision: str | None) -> bool:
    from vramlab.sources.hub import HubClient

    assert isinstance(client, HubClient)
    return client.cached_commit(repo, revision or "main") is not None


def spec_from_path(path: Path) -> ModelSpec:
    """A local model: a directory, a `config.json`, or a `.gguf` file."""
    if path.is_dir():
        return _spec_from_directory(path)
    if path.suffix.lower() == ".gguf":
        from vramlab.sources.gguf_file import spec_from_gguf

        return spec_from_gguf(path)
    if path.suffix.lower() == ".json":
        if path.name == "model.safetensors.index.json":
            return _spec_from_directory(path.parent)
        return _spec_from_config_file(path, name=path.parent.name or path.stem)
    if path.suffix.lower() == ".safetensors":
        return _spec_from_directory(path.parent)
    raise ConfigError(f"{path}: not a model directory, config.json or .gguf file")


# ModelOpt before 0.31 wrote its quantization config beside config.json, not inside it; vLLM reads it as
# the `quantization_config` when config.json has none (vllm/transformers_utils/config.py `get_config`).
HF_QUANT_CONFIG = "hf_quant_config.json"


def _spec_from_config_file(path: Path, name: str) -> ModelSpec:
    from vramlab.infile import read_text
    from vramlab.sources.hf_config import spec_from_config

    text = read_text(path, "config.json", expect="not valid JSON")
    try:
        config = json.loads(text)
    except (ValueError, RecursionError):
        raise ConfigError(f"{path}: not valid JSON") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    quant_file = path.parent / HF_QUANT_CONFIG
    if "quantization_config" not in config and quant_file.is_file():
        try:
            quant = json.loads(read_text(quant_file, HF_QUANT_CONFIG, expect="not valid JSON"))
        except (ValueError, RecursionError):
            raise ConfigError(f"{quant_file}: not valid JSON") from None
        if not isinstance(quant, dict):
            raise ConfigError(f"{quant_file}: expected a JSON object")
        config = {**config, "quantization_config": quant}
    return spec_from_config(config, name=name, source=str(path))


def _spec_from_directory(d: Path) -> ModelSpec:
    """config.json, plus exact weights from safetensors headers when the shards are there."""
    config = d / "config.json"
    if not config.is_file():
        ggufs = sorted(d.glob("*.gguf"))
        if len(ggufs) == 1:
            from vramlab.sources.gguf_file import spec_from_gguf

            return spec_from_gguf(ggufs[0])
        hint = f" ({len(ggufs)} .gguf files: name one)" if ggufs else ""
        raise ConfigError(f"{d}: no config.json in this directory{hint}")
    spec = _spec_from_config_file(config, name=d.resolve().name)
    from vramlab.sources.safetensors import read_directory_weights, with_weights

    weights = read_directory_weights(d)
    if weights is None:
        return spec
    return with_weights(spec, weights, f"{d} (config.json + safetensors headers)")
