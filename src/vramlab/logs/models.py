"""The model a start-up ran, from what its log says: the name it prints (in any of the spellings logs
use: a path, a Hub cache folder, an Ollama tag, a GGUF file name) looked up in the catalog, a local
file or (with --online) the Hub; for llama.cpp, the shape it printed (logs/llamacpp_model.py) when
no catalog entry has the name, or when the entry's shape is not the printed one.
"""

from __future__ import annotations

import re
from typing import Any

from vramlab.errors import VramlabError
from vramlab.logs.observation import Observation

# Suffixes that name a checkpoint's packaging or quantization, not the model.
_PACKAGING = re.compile(
    r"(?:[-_.](?:gguf|awq|gptq(?:-int[48])?|int[48](?:-awq)?|fp8(?:-dynamic)?|bnb-4bit|w4a16|w8a8|"
    r"quantized(?:\.w\d+a\d+)?|(?:i?q\d(?:_[0-9a-z]+)*)|bf16|f16|f32|mxfp4))+$",
    re.IGNORECASE,
)


def model_candidates(name: str) -> list[str]:
    """Spellings of a model name a log prints, most specific first: the name; a path's last
    component; without `.gguf`, an Ollama `:tag`, quantization and packaging suffixes; with
    spaces as dashes (GGUF `general.name`)."""
    out: list[str] = []
    base = name.strip().strip("'\"")
    # A Hugging Face cache directory names its repository: '.../models--Qwen--Qwen3-14B/snapshots/<hash>'.
    hub = re.search(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/", base)
    if hub:
        out.extend(model_candidates(f"{hub.group(1)}/{hub.group(2)}"))
    last = base.rstrip("/").rsplit("/", 1)[-1]
    # A Hub id ('org/Name-GGUF') keeps its organisation; a filesystem path does not have one.
    org = base.split("/")[0] if base.count("/") == 1 and not base.startswith((".", "~")) else None
    for cand in (base, last):
        stem = re.sub(r"\.gguf$", "", cand, flags=re.IGNORECASE).split(":", 1)[0]
        stripped = _PACKAGING.sub("", stem)
        dashed = stripped.lower().replace(" ", "-")
        for c in (cand, stem, stripped, stripped.replace(" ", "-"), dashed, dashed.removeprefix("meta-")):
            if c and c not in out:
                out.append(c)
        if org and cand is last and stripped != last:
            out.append(f"{org}/{stripped}")
    return out


def _resolve(name: str, offline: bool, explicit: bool = False) -> tuple[Any, str]:
    """The model a log names, via the catalog under any of its spellings, else a local path or
    (with --online) the Hub."""
    from vramlab.sources import resolve_model
    from vramlab.sources.catalog import find_entry

    for cand in model_candidates(name):
        entry = find_entry(cand)
        if entry is not None:
            return entry.spec(), ""
    first_error = ""
    for cand in dict.fromkeys([name] + ([] if explicit else model_candidates(name)[1:2])):
        try:
            return resolve_model(cand, offline=offline), ""
        except VramlabError as exc:
            first_error = first_error or str(exc)
    if offline:
        return None, (
            f"model {name!r} is not in the bundled catalog; pass --model (a catalog name or a local "
            "config.json / model directory), or --online to read it from the Hugging Face Hub"
        )
    return None, f"model {name!r}: {first_error}"


def _shape(spec: Any) -> tuple[int, int, int]:
    return (spec.num_layers, spec.hidden_size, spec.num_kv_heads)


def model_for(
    obs: Observation, model: str | None, offline: bool, quantization: str | None = None
) -> tuple[Any, str, list[str]]:
    """(spec or None, why there is none, notes) for an observation: --model, else the name the log
    prints, else llama.cpp's printed shape."""
    from vramlab.logs import llamacpp_model

    names = [n for n in (model, obs.model, obs.extra.get("model_path")) if isinstance(n, str) and n]
    printed = bool(obs.extra.get("hparams") or obs.extra.get("gguf"))
    spec, why = None, "the log does not name the model; pass --model"
    if names:
        spec, why = _resolve(names[0], offline, explicit=model is not None)
        if spec is None and len(names) > 1 and model is None:
            spec, _ = _resolve(names[1], offline, explicit=False)
    if model is not None or not printed:
        return spec, why, []
    label = obs.model or (names[0] if names else "the model")
    try:
        from_log = llamacpp_model.spec_from_log(
            obs.extra, label, quantization or obs.settings.get("quantization")
        )
    except VramlabError as exc:
        if spec is not None:
            return spec, why, []
        return None, f"{why.rstrip('.')}; {exc} (pass --model)", []
    if spec is None:
        return (
            from_log,
            "",
            ["model shape from the log's printed hyperparameters (no catalog entry by that name)"],
        )
    if _shape(spec) != _shape(from_log):
        return (
            from_log,
            "",
            [
                f"the log's printed shape (layers, hidden, KV heads = {_shape(from_log)}) is not the catalog's "
                f"{spec.name} {_shape(spec)}: predicted with the log's"
            ],
        )
    return spec, why, []


__all__ = ["model_candidates", "model_for"]
