"""A vLLM command line pasted into a log (`vllm serve MODEL --max-model-len 4096 -tp 2 ...`, or
`python -m vllm.entrypoints.openai.api_server --model M`, possibly over several lines), read as settings."""

from __future__ import annotations

import re
from typing import Any

from vramlab.logs.base import command_flags, integer

# A command, not vLLM's own log record that names one ("Restart vllm serve with --enable-scale-out ...",
# a DeprecationWarning about `python -m vllm.entrypoints.openai.api_server`): no `[file.py:N]` logger
# prefix and no `file.py:N: ...Warning:` in front.
COMMAND = (
    r"^(?!.*\[[\w.]+\.py:\d+\] )(?!.*\.py:\d+: \w*Warning)"
    r".*?(?:^|\s)(?:vllm serve (?P<model>\S+)|python3? -m vllm\.entrypoints\.\S+).*"
)

_FLAGS = (
    (("--max-model-len", "--max_model_len"), "settings.max_model_len", integer),
    (
        ("--tensor-parallel-size", "--tensor_parallel_size", "--tensor-parallel", "-tp"),
        "settings.tensor_parallel_size",
        integer,
    ),
    (("--pipeline-parallel-size", "-pp"), "settings.pipeline_parallel_size", integer),
    (("--gpu-memory-utilization", "--gpu_memory_utilization"), "settings.gpu_memory_utilization", float),
    (("--max-num-seqs", "--max_num_seqs"), "settings.max_num_seqs", integer),
    (("--max-num-batched-tokens", "--max_num_batched_tokens"), "settings.max_num_batched_tokens", integer),
    (("--dtype",), "settings.dtype", str),
    (("--kv-cache-dtype",), "settings.kv_cache_dtype", str),
    (("--quantization", "-q"), "settings.quantization", str),
)


def continued(m: re.Match[str]) -> dict[str, Any] | None:
    """The flags of a command pasted over several lines (`  --max-model-len 32768 \\`): each
    continuation line is read on its own, so a line in between (a note, a progress bar) loses nothing."""
    text = " " + m.group(0)
    out = command_flags(text, _FLAGS)
    if re.search(r"\s--enforce[-_]eager\b", text):
        out["settings.enforce_eager"] = True
    return out or None


def command(m: re.Match[str]) -> dict[str, Any]:
    """A pasted command line: `vllm serve MODEL --max-model-len 4096 -tp 2 ...`."""
    text = m.group(0)
    out: dict[str, Any] = {}
    model = m.group("model") or re.search(r"--model[= ](\S+)", text)
    if isinstance(model, re.Match):
        model = model.group(1)
    if model and not model.startswith("-"):
        out["model"] = model.strip("'\"")
    out.update(command_flags(text, _FLAGS))
    if re.search(r"\s--enforce[-_]eager\b", text):
        out["settings.enforce_eager"] = True
    if "VLLM_USE_V1=1" in text:
        out["settings.vllm_engine"] = "v1"
    elif "VLLM_USE_V1=0" in text:
        out["settings.vllm_engine"] = "v0"
    return out
