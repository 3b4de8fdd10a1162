"""Hugging Face text-generation-inference logs (docs/research/capacity-anchors.md section 4).

TGI prints token capacities, not bytes: the router's `Setting max batch total tokens to N`
(the KV pool in tokens) and the server's `KV-cache blocks: B, size: S`. Settings come from
the launcher's `Args { ... }` (Rust debug format: `key: Some(v)`, `key: None`), printed on one line or
pretty-printed over one field per line (`num_shard: Some(` / `2,` / `),` ... `}`), and from the defaults
the launcher and router announce (`Default `max_batch_prefill_tokens` to N`, `Maximum total tokens
defaulted to N`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from vramlab.logs import devices
from vramlab.logs.base import Rule, assemble, one_line_blocks, parse_lines, rule

ENGINE = "tgi"

_ARGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "model_id": ("model", str),
    "num_shard": ("settings.tensor_parallel_size", int),
    "quantize": ("settings.quantization", lambda v: v.lower()),
    "dtype": ("settings.dtype", lambda v: v.lower()),
    "kv_cache_dtype": ("settings.kv_cache_dtype", lambda v: v.lower()),
    "max_total_tokens": ("settings.max_model_len", int),
    "max_batch_prefill_tokens": ("settings.max_batch_prefill_tokens", int),
    "cuda_memory_fraction": ("settings.gpu_memory_utilization", float),
}


def _args(m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for km in re.finditer(r"(\w+): (Some\(\"?([^\")]*)\"?\)|\"([^\"]*)\"|None|[\w.-]+)", m.group(1)):
        key = km.group(1)
        if key not in _ARGS or km.group(2) == "None":
            continue
        raw = (
            km.group(3)
            if km.group(3) is not None
            else km.group(4)
            if km.group(4) is not None
            else km.group(2)
        )
        name, conv = _ARGS[key]
        try:
            out.setdefault(name, conv(raw))
        except ValueError:
            continue
    return out


RULES: list[Rule] = [
    rule("args", r"Args \{(.*)", _args, starts=True, shared=True),
    rule(
        "prefill_default",
        r"Default `max_batch_prefill_tokens` to (\d+)",
        lambda m: {"settings.max_batch_prefill_tokens": int(m.group(1))},
        shared=True,
    ),
    rule(
        "total_default",
        r"Maximum total tokens defaulted to (\d+)",
        lambda m: {"settings.max_model_len": int(m.group(1))},
        shared=True,
    ),
    rule(
        "version",
        r"text-generation-launcher (\d+\.\d+\.\d+)",
        lambda m: {"engine_version": m.group(1)},
        shared=True,
    ),
    rule(
        "shards",
        r"Sharding model on (\d+) processes",
        lambda m: {"settings.tensor_parallel_size": int(m.group(1))},
        shared=True,
    ),
    rule(
        "max_total",
        r"(?:Setting|Inferred) max batch total tokens(?: to|:) (\d+)",
        lambda m: {"kv_cache_tokens": int(m.group(1))},
        shared=True,
    ),
    rule(
        "blocks",
        r"KV-cache blocks: (\d+), size: (\d+)",
        lambda m: {"gpu_blocks": int(m.group(1)), "block_size": int(m.group(2))},
        shared=True,
    ),
    # backends/v3 (3.x) `check_max_batch_total_tokens`: the pool the warm-up found is below one request of
    # max_total_tokens (V3Error::NotEnoughMemory, "Not enough memory to handle `max_total_tokens={0}`", or its Debug
    # form when main returns it); 1.x's warm-up said "Not enough memory to handle N total tokens with P prefill
    # tokens" for a --max-batch-total-tokens the pool could not hold. The pool itself is printed only as
    # "KV-cache blocks" (server) or not at all.
    rule(
        "no_room",
        r"Not enough memory to handle `max_total_tokens=(\d+)`|NotEnoughMemory\((\d+)\)"
        r"|Not enough memory to handle (\d+) total tokens",
        lambda m: {
            "extra.kv_capacity_below_tokens": int(next(g for g in m.groups() if g)),
            "extra.refused": True,
        },
        shared=True,
    ),
    rule(
        "graphs",
        r"Cuda Graphs are enabled for sizes \[([\d, ]*)\]",
        lambda m: {"extra.cuda_graph_sizes": [int(x) for x in m.group(1).split(",") if x.strip()]},
        shared=True,
    ),
] + devices.RULES


def parse(lines: Iterable[str]) -> list[Any]:
    startups, _ = parse_lines(_one_line_args(lines), RULES)
    return assemble(ENGINE, startups, _finish)


_ARGS_FIELDS_MAX = 200  # a pretty-printed Args block has ~60 fields; a missing `}` must not swallow the log


def _one_line_args(lines: Iterable[str]) -> Iterable[str]:
    """A pretty-printed `Args {` block as the one line the `args` rule reads (`Some(\n 2,\n)` -> `Some(2)`)."""
    return one_line_blocks(
        lines,
        lambda line: line.rstrip().endswith("Args {"),
        lambda line: line.strip() == "}",
        _ARGS_FIELDS_MAX,
        _flatten,
    )


def _flatten(block: list[str]) -> str:
    return re.sub(r"Some\(\s*(.*?),?\s*\)", r"Some(\1)", " ".join(block))


def _finish(fields: dict[str, Any]) -> None:
    if fields.get("kv_cache_tokens") is None and fields.get("gpu_blocks") and fields.get("block_size"):
        fields["kv_cache_tokens"] = fields["gpu_blocks"] * fields["block_size"]
