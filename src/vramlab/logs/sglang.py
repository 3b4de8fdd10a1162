"""SGLang start-up logs (docs/research/capacity-anchors.md section 2).

SGLang prints "GB" but divides by 2^30, so its figures are GiB. Ranks are named by the
`[... TP1]` prefix (older releases: `[gpu_id=1]`). `KV Cache is allocated` gives K and V
separately; the observation's `kv_cache_bytes` is their sum.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from vramlab.logs import devices
from vramlab.logs.base import Rule, assemble, command_flags, gib, parse_lines, rule

ENGINE = "sglang"
N = r"-?\d+(?:\.\d+)?"

_SERVER_ARGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "model_path": ("model", str),
    "context_length": ("settings.max_model_len", int),
    "mem_fraction_static": ("settings.mem_fraction_static", float),
    "tp_size": ("settings.tensor_parallel_size", int),
    "pp_size": ("settings.pipeline_parallel_size", int),
    "dtype": ("settings.dtype", str),
    "kv_cache_dtype": ("settings.kv_cache_dtype", str),
    "quantization": ("settings.quantization", str),
    "chunked_prefill_size": ("settings.chunked_prefill_size", int),
    "cuda_graph_max_bs": ("settings.cuda_graph_max_bs", int),
    "max_running_requests": ("settings.max_num_seqs", int),
    "disable_cuda_graph": ("settings.enforce_eager", lambda v: v == "True"),
}


def _server_args(m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for km in re.finditer(r"(\w+)=('[^']*'|\"[^\"]*\"|[^,()\s]+)", m.group(1)):
        key, raw = km.group(1), km.group(2).strip("'\"")
        if key in _SERVER_ARGS and raw not in ("None", ""):
            name, conv = _SERVER_ARGS[key]
            try:
                out.setdefault(name, conv(raw))
            except ValueError:
                continue
    return out


def _weights_end(m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"extra.avail_after_load_bytes": gib(m.group("avail"))}
    if m.group("dtype"):
        out["settings.dtype"] = m.group("dtype").replace("torch.", "")
    if m.group("usage"):
        out["weights_bytes"] = gib(m.group("usage"))
    return out


def _kv(m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"kv_cache_bytes": gib(m.group("k")) + gib(m.group("v"))}
    if m.group("tokens"):
        out["kv_cache_tokens"] = int(m.group("tokens"))
    return out


def _max_tokens(m: re.Match[str]) -> dict[str, Any]:
    text = m.group(0)
    out: dict[str, Any] = {"kv_cache_tokens": int(m.group(1))}
    for key, name in (
        ("context_len", "settings.max_model_len"),
        ("chunked_prefill_size", "settings.chunked_prefill_size"),
        ("max_running_requests", "extra.max_running_requests"),
    ):
        f = re.search(rf"\b{key}=(\d+)", text)
        if f:
            out[name] = int(f.group(1))
    avail = re.search(rf"\bavailable_gpu_mem=({N}) ?GB", text)
    if avail:
        out["extra.available_gpu_mem_bytes"] = gib(avail.group(1))
    return out


_FLAGS = (
    (("--tp", "--tp-size", "--tensor-parallel-size"), "settings.tensor_parallel_size", int),
    (("--pp", "--pp-size"), "settings.pipeline_parallel_size", int),
    (("--mem-fraction-static",), "settings.mem_fraction_static", float),
    (("--context-length",), "settings.max_model_len", int),
    (("--chunked-prefill-size",), "settings.chunked_prefill_size", int),
    (("--max-running-requests",), "settings.max_num_seqs", int),
    (("--cuda-graph-max-bs",), "settings.cuda_graph_max_bs", int),
    (("--kv-cache-dtype",), "settings.kv_cache_dtype", str),
    (("--quantization",), "settings.quantization", str),
    (("--dtype",), "settings.dtype", str),
)


def _continued(m: re.Match[str]) -> dict[str, Any] | None:
    """The flags of a launch command pasted over several lines (`  --tp-size 4 \\`), each line on its own."""
    text = " " + m.group(0)
    out = command_flags(text, _FLAGS)
    model = re.search(r"\s--model(?:-path)?[= ](\S+)", text)
    if model and model.group(1) != "\\":
        out["model"] = model.group(1).strip("'\"")
    if re.search(r"\s--disable-cuda-graph\b", text):
        out["settings.enforce_eager"] = True
    return out or None


def _command(m: re.Match[str]) -> dict[str, Any]:
    """A pasted `python -m sglang.launch_server --model-path X --tp 2 ...` command line."""
    text = m.group(0)
    out: dict[str, Any] = {}
    model = re.search(r"\s--model(?:-path)?[= ](\S+)", text)
    if model:
        out["model"] = model.group(1).strip("'\"")
    out.update(command_flags(text, _FLAGS))
    if re.search(r"\s--disable-cuda-graph\b", text):
        out["settings.enforce_eager"] = True
    return out


RULES: list[Rule] = [
    rule("command", r"sglang\.launch_server\b.*", _command, starts=True, shared=True),
    rule("command_continued", r"^\s+--[A-Za-z][\w-]*.*", _continued, shared=True, generic=True),
    rule("server_args", r"server_args=ServerArgs\((.*)", _server_args, starts=True, shared=True),
    rule(
        "weights_begin",
        rf"Load weight begin\. avail mem=({N}) ?GB",
        lambda m: {"free_gpu_memory_bytes": gib(m.group(1))},
        once=True,
    ),
    rule(
        "weights_end",
        rf"Load weight end\.(?: type=\w+,)?(?: dtype=(?P<dtype>[\w.]+),)? avail mem=(?P<avail>{N}) ?GB"
        rf"(?:, mem usage=(?P<usage>{N}) ?GB)?",
        _weights_end,
    ),
    rule(
        "kv",
        rf"KV Cache is allocated\.(?: #tokens: (?P<tokens>\d+),)? K size: (?P<k>{N}) ?GB, V size: (?P<v>{N}) ?GB",
        _kv,
        once=True,
    ),
    rule(
        "mamba",
        rf"Mamba Cache is allocated\..*?conv_state size: ({N}) ?GB, ssm_state size: ({N}) ?GB",
        lambda m: {"extra.mamba_state_bytes": gib(m.group(1)) + gib(m.group(2))},
    ),
    rule(
        "pool_end",
        rf"Memory pool end\. avail mem=({N}) ?GB",
        lambda m: {"extra.avail_after_pool_bytes": gib(m.group(1))},
    ),
    rule(
        "graph_begin",
        rf"Capture cuda graph begin\..*?avail mem=({N}) ?GB",
        lambda m: {"extra.avail_before_graphs_bytes": gib(m.group(1))},
    ),
    rule(
        "graph_end",
        rf"Capture cuda graph end\. Time elapsed: {N} ?s\.(?: mem usage=(?P<usage>{N}) ?GB\.)?"
        rf"(?: avail mem=(?P<avail>{N}) ?GB)?",
        lambda m: {
            "cuda_graph_bytes": gib(m.group("usage")) if m.group("usage") else None,
            "extra.avail_after_graphs_bytes": gib(m.group("avail")) if m.group("avail") else None,
        },
    ),
    rule("max_tokens", r"max_total_num_tokens=(\d+).*", _max_tokens, shared=True),
    # model_runner.py init_memory_pool (0.1-0.5; pool_configurator.py MemoryPoolConfig later): the pool came out at
    # zero tokens or fewer. No figure is printed: the refusal itself is the observation.
    rule(
        "no_pool",
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        lambda m: {"extra.kv_pool_empty": True, "extra.refused": True},
        shared=True,
    ),
    # ... and a --max-total-tokens above what profiling found: the profiled pool in tokens.
    rule(
        "profiled_tokens",
        r"max_total_tokens=(\d+) is larger than the profiled value (\d+)",
        lambda m: {"extra.profiled_max_total_tokens": int(m.group(2))},
        shared=True,
    ),
] + devices.RULES


def parse(lines: Iterable[str]) -> list[Any]:
    startups, _ = parse_lines(lines, RULES)
    return assemble(ENGINE, startups, _finish)


def _finish(fields: dict[str, Any]) -> None:
    # Older releases print only 'avail mem' around the load: the weights are the difference.
    before, after = fields.get("free_gpu_memory_bytes"), fields.get("extra.avail_after_load_bytes")
    if fields.get("weights_bytes") is None and before is not None and after is not None:
        fields["weights_bytes"] = before - after
    if fields.get("settings.mem_fraction_static") is not None:
        fields.setdefault("gpu_memory_utilization", fields["settings.mem_fraction_static"])
