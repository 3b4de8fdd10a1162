"""vLLM's settings as its log prints them: the API server's version and non-default arguments, the
start-up banner, the engine's config line, a pasted `vllm serve` command (logs/vllm_command.py), the
model being loaded and the length it uses. logs/vllm.py reads the memory lines.
"""

from __future__ import annotations

import re
from typing import Any

from vramlab.logs.base import Rule, rule
from vramlab.logs.vllm_command import COMMAND, command, continued

_ARG_KEYS = {
    "model": "model",
    "max_model_len": "settings.max_model_len",
    "gpu_memory_utilization": "settings.gpu_memory_utilization",
    "tensor_parallel_size": "settings.tensor_parallel_size",
    "pipeline_parallel_size": "settings.pipeline_parallel_size",
    "dtype": "settings.dtype",
    "kv_cache_dtype": "settings.kv_cache_dtype",
    "quantization": "settings.quantization",
    "max_num_seqs": "settings.max_num_seqs",
    "max_num_batched_tokens": "settings.max_num_batched_tokens",
    "enforce_eager": "settings.enforce_eager",
    "block_size": "settings.block_size",
    "kv_cache_memory_bytes": "settings.kv_cache_memory_bytes",
    "num_gpu_blocks_override": "settings.num_gpu_blocks_override",
    # The engine config line names max_model_len `max_seq_len`.
    "max_seq_len": "settings.max_model_len",
}
_INT_KEYS = {
    "max_model_len",
    "max_seq_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "kv_cache_memory_bytes",
    "num_gpu_blocks_override",
}


def _value(key: str, raw: str) -> Any:
    v = raw.strip().strip("'\"")
    if v in ("None", ""):
        return None
    if key in _INT_KEYS:
        return int(v)
    if key == "gpu_memory_utilization":
        return float(v)
    if key == "enforce_eager":
        return v == "True"
    if key == "dtype":
        return v.replace("torch.", "")
    return v


def _pairs(text: str, sep: str) -> dict[str, Any]:
    """Pick known keys out of `{'k': v, ...}` (sep ':') or `k=v, ...` (sep '='), tolerating
    truncated lines and values that are not Python literals (`torch.bfloat16`)."""
    out: dict[str, Any] = {}
    pat = re.compile(r"['\"]?(\w+)['\"]?\s*" + re.escape(sep) + r"\s*('[^']*'|\"[^\"]*\"|[^,{}()\s]+)")
    for m in pat.finditer(text):
        key = m.group(1)
        if key in _ARG_KEYS and _ARG_KEYS[key] not in out:
            try:
                val = _value(key, m.group(2))
            except ValueError:
                continue
            if val is not None:
                out[_ARG_KEYS[key]] = val
    return out


def _engine_config(m: re.Match[str]) -> dict[str, Any]:
    out = _pairs(m.group("config") or "", "=")
    if m.group("version"):
        out["engine_version"] = m.group("version")
    if m.group("era"):
        out["settings.vllm_engine"] = m.group("era").lower()
    return out


SETTINGS_RULES: list[Rule] = [
    rule(
        "version",
        r"vLLM API server version (\S+)",
        lambda m: {"engine_version": m.group(1), "settings.api_server": True},
        starts=True,
        shared=True,
    ),
    rule("args", r"non-default args: (\{.*)", lambda m: _pairs(m.group(1), ":"), starts=True, shared=True),
    # 0.11+ start-up banner: block-letter art, then `version 0.17.1` / `model   Qwen/...` on its right.
    rule(
        "banner_version",
        r"[\u2580\u2584\u2588]\s+version\s+v?(\d+\.\d+[\w.+-]*)\s*$",
        lambda m: {"engine_version": m.group(1), "settings.vllm_engine": "v1"},
        starts=True,
        shared=True,
    ),
    rule(
        "banner_model",
        r"[\u2580\u2584\u2588]\s+model\s+(\S+)\s*$",
        lambda m: {"model": m.group(1)},
        shared=True,
    ),
    rule(
        "engine_config",
        r"Initializing an? (?:(?P<era>V[01]) )?LLM engine(?: \(v(?P<version>[^)\s]+)\))?(?: with config: (?P<config>.*))?",
        _engine_config,
        starts=True,
        shared=True,
    ),
    rule(
        "chunked",
        r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)",
        lambda m: {"settings.max_num_batched_tokens": int(m.group(1))},
        shared=True,
    ),
    rule(
        "command",
        COMMAND,
        command,
        starts=True,
        shared=True,
    ),
    rule("command_continued", r"^\s+--?[A-Za-z][\w-]*.*", continued, shared=True, generic=True),
    rule(
        "loading_model",
        r"Starting to load model (\S+?)(?:\.\.\.)?$",
        lambda m: {"model": m.group(1)},
        shared=True,
    ),
    rule(
        "max_len",
        r"Using max model len (\d+)",
        lambda m: {"settings.max_model_len": int(m.group(1))},
        shared=True,
    ),
]

__all__ = ["SETTINGS_RULES"]
