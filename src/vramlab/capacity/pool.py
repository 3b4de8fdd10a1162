"""Turning KV bytes into blocks, tokens and concurrency, as vLLM V1's KV cache manager does.

Uniform models: `num_blocks = bytes // (page x layers)`, concurrency = blocks / cdiv(len, block).
Hybrid models (sliding window, chunked local, Mamba next to full attention): layers are
grouped by kind into groups of `min(#layers per kind)`; one pool tensor is shared by one layer
of each group, so `num_blocks = bytes // (page x group_size)` and a request needs blocks in
every group (vllm/v1/core/kv_cache_utils.py). Sliding groups need only
`cdiv(min(window - 1 + max_num_batched_tokens, len), block) + 1` blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vramlab.capacity.kv import KVShape


@dataclass(frozen=True)
class PoolLayout:
    block_size: int
    page_bytes: int  # one block of one layer (the largest kind's)
    group_size: int  # layers sharing one block id
    groups: tuple[tuple[str, int], ...]  # (kind, number of groups of that kind)
    padded_layers: int  # layer slots added to fill the last group of a kind
    state_page_bytes: int = 0  # Mamba state page (per sequence, per mamba group)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs across the pool (all tensors)."""
        return self.page_bytes * self.group_size

    @property
    def num_groups(self) -> int:
        return sum(n for _, n in self.groups)


def layout(
    shapes: tuple[KVShape, ...] | list[KVShape],
    block_size: int,
    mamba_layers: int = 0,
    state_bytes_per_layer: int = 0,
    hybrid_manager: bool = True,
) -> PoolLayout:
    """How the pool is laid out on one GPU."""
    shapes = [s for s in shapes if s.layers > 0]
    if not shapes and not mamba_layers:
        return PoolLayout(block_size, 0, 0, (), 0)
    if not hybrid_manager or (len(shapes) <= 1 and not mamba_layers):
        # One kind (or the hybrid manager disabled): every layer is a full-length layer.
        layers = sum(s.layers for s in shapes)
        per_token = max((s.bytes_per_token_layer for s in shapes), default=0)
        return PoolLayout(block_size, per_token * block_size, layers, (("full", 1),), 0)
    counts = [s.layers for s in shapes] + ([mamba_layers] if mamba_layers else [])
    gsize = min(counts)
    groups = [(s.kind, math.ceil(s.layers / gsize)) for s in shapes]
    if mamba_layers:
        groups.append(("mamba", math.ceil(mamba_layers / gsize)))
    padded = sum(n * gsize for _, n in groups) - sum(counts)
    page = max(s.bytes_per_token_layer for s in shapes) * block_size if shapes else state_bytes_per_layer
    return PoolLayout(block_size, page, gsize, tuple(groups), padded, state_bytes_per_layer)


def blocks_per_request(
    lay: PoolLayout,
    max_model_len: int,
    max_num_batched_tokens: int,
    sliding_window: int | None,
    chunk: int | None,
    mamba_blocks: int = 1,
) -> int:
    """Blocks one request of *max_model_len* tokens holds across all groups."""
    full = math.ceil(max_model_len / lay.block_size)
    total = 0
    for kind, n in lay.groups:
        if kind == "sliding" and sliding_window:
            need = (
                math.ceil(min(sliding_window - 1 + max_num_batched_tokens, max_model_len) / lay.block_size)
                + 1
            )
        elif kind == "chunked" and chunk:
            need = math.ceil(min(chunk + max_num_batched_tokens, max_model_len) / lay.block_size)
        elif kind == "mamba":
            need = mamba_blocks
        else:
            need = full
        total += n * need
    return max(1, total)


def num_blocks(kv_bytes: int, lay: PoolLayout) -> int:
    if lay.bytes_per_block <= 0:
        return 0
    return max(0, kv_bytes // lay.bytes_per_block)
