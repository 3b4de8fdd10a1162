"""Hugging Face `transformers serve` logs (transformers 5.x, read from real start-ups of 5.24.0).

`transformers serve` sizes no KV pool when it starts: the model is loaded with `from_pretrained`
and each request grows its own cache. So its start-up prints no memory figure, and every
observation it gives is incomplete (no KV decision). What it does print, at `--log-level info`:

    [transformers] Loading /models/tiny-llama            (the model, `@revision` for a Hub id)
    [transformers] Model config LlamaConfig {            (the config as JSON, one key per line,
      "num_hidden_layers": 2, ...                         up to a closing `}`; printed several
      "transformers_version": "5.24.0", ...               times, and once with `--dtype`'s value
    }                                                     when it overrides the checkpoint's)
    [transformers] Will use dtype=torch.bfloat16 as defined in model's config object
    INFO:     Started server process [27920]             (uvicorn: the process)
    INFO:     Uvicorn running on http://127.0.0.1:8000   (where it listens)

At the default `--log-level warning` only the `Loading` line and uvicorn's lines remain. The
config's `transformers_version` is the running library's (`PretrainedConfig.to_dict` writes its
own version), so it is read as the engine version. The device is not printed.

A start-up is one model load: the `Loading` line opens one (a restart prints it again), and
uvicorn's `Started server process` opens one for a server that loads its models on demand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from vramlab.logs import devices
from vramlab.logs.base import Rule, StartUp, assemble, one_line_blocks, parse_lines, rule

ENGINE = "transformers"
_DUMP_START = re.compile(r"\bModel config (\w+) \{$")
_DUMP_FIELDS_MAX = 400  # a config has ~30-150 keys; a missing `}` must not swallow the log
# config keys that size the weights and the per-token cache, read as extra.<key>
_CONFIG_KEYS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "sliding_window",
    "num_local_experts",
    "num_experts",
)


def _config(m: re.Match[str]) -> dict[str, Any] | None:
    try:
        cfg = json.loads(m.group(2))
    except ValueError:
        return None
    if not isinstance(cfg, dict):
        return None
    inner = cfg.get("text_config")
    text: dict[str, Any] = inner if isinstance(inner, dict) else cfg  # a vision-language model: its text half
    out: dict[str, Any] = {
        f"extra.{k}": text[k]
        for k in _CONFIG_KEYS
        if isinstance(text.get(k), (int, float, str)) and not isinstance(text.get(k), bool)
    }
    if isinstance(text.get("tie_word_embeddings"), bool):
        out["extra.tie_word_embeddings"] = text["tie_word_embeddings"]
    arch = cfg.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        out["extra.architecture"] = arch[0]
    if isinstance(cfg.get("transformers_version"), str):
        out["engine_version"] = cfg["transformers_version"]
    if isinstance(cfg.get("dtype") or cfg.get("torch_dtype"), str):
        out["extra.checkpoint_dtype"] = cfg.get("dtype") or cfg.get(
            "torch_dtype"
        )  # the first dump: the file's
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        out["settings.quantization"] = quant["quant_method"].lower()
    return out


def _loading(m: re.Match[str]) -> dict[str, Any]:
    name, _, revision = m.group(1).partition("@")
    return {"model": name, "extra.revision": revision or None}


OWN_RULES: list[Rule] = [
    rule("loading", r"\[transformers\] Loading (\S+)$", _loading, once=True, shared=True),
    rule("config", r"\[transformers\] Model config (\w+) (\{.*\})$", _config, shared=True),
    rule(
        "dtype",
        r"\[transformers\] Will use dtype=torch\.(\w+)",
        lambda m: {"settings.dtype": m.group(1)},
        shared=True,
    ),
    rule(
        "request",
        r"\[transformers\] \[Request received\] Model: .*, CB: (True|False)",
        lambda m: {"extra.continuous_batching": m.group(1) == "True"},
        shared=True,
    ),
    rule(
        "unloaded",
        r"\[transformers\] (\S+) was removed from memory after (\d+)s of inactivity",
        lambda m: {"extra.unloaded_after_s": int(m.group(2))},
        shared=True,
    ),
]
# uvicorn's lines: other engines print them too (vLLM, SGLang), so they do not count towards
# telling that a log is transformers'.
RULES: list[Rule] = (
    OWN_RULES
    + [
        rule(
            "process",
            r"Started server process \[(\d+)\]",
            lambda m: {"extra.pid": int(m.group(1))},
            once=True,
            shared=True,
        ),
        rule("listen", r"Uvicorn running on (\S+)", lambda m: {"extra.listen": m.group(1)}, shared=True),
    ]
    + devices.RULES
)


def parse(lines: Iterable[str]) -> list[Any]:
    startups, _ = parse_lines(_one_line_configs(lines), RULES)
    for su in startups:
        _requested_dtype(su)
    return assemble(ENGINE, startups, None)


def _requested_dtype(su: StartUp) -> None:
    """No `Will use dtype` line (a `--dtype` given): the dtype is the one a later config dump
    carries when it is neither `auto` nor the checkpoint's (the first dump's)."""
    fields = su.shared.fields
    if "settings.dtype" in fields:
        return
    first = fields.get("extra.checkpoint_dtype")
    for _, text in su.shared.lines:
        m = re.search(r"Model config \w+ (\{.*\})$", text)
        try:
            d = json.loads(m.group(1)).get("dtype") if m else None
        except (ValueError, AttributeError):
            continue
        if isinstance(d, str) and d not in ("auto", first):
            fields["settings.dtype"] = d
            return


def _one_line_configs(lines: Iterable[str]) -> Iterable[str]:
    """A `Model config XConfig {` block (the JSON, one key per line, up to `}`) as one line."""
    return one_line_blocks(
        lines, lambda line: bool(_DUMP_START.search(line)), lambda line: line == "}", _DUMP_FIELDS_MAX
    )
