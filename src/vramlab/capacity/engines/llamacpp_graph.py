"""llama.cpp's compute graph: the KV cells one attention reads, the graph's phases for a server's
settings, the logit rows it reserves, and the compute buffer they size (engines/llamacpp_placement.py
holds the phases' shapes). Split from engines/llamacpp.py, which plans the buffers around it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vramlab.capacity.engines import llamacpp_placement as place
from vramlab.capacity.engines.common import Context
from vramlab.capacity.estimate import Component, band

if TYPE_CHECKING:
    from vramlab.capacity.engines.llamacpp import ServerSetup

# PR #23861 (merged 2026-05-29; issue #23527 reported on b9272 a week before): llama-server reserves logits
# for n_seqs rows instead of n_ubatch. The first build is not pinned: b9300 is taken.
LOGITS_PER_SEQ_FROM = (9300,)

# PR #14363 (llama : add high-throughput mode, merged July 2025): a KV stream per sequence unless
# --kv-unified. The first build is not pinned: b5920 is taken.
KV_STREAMS_FROM = (5920,)


def reserved_outputs(ctx: Context, server: ServerSetup) -> int:
    """Logit rows the worst-case graph reserves: every token of a ubatch (`graph_reserve(n_tokens, n_seqs,
    n_tokens)`), except in llama-server from PR #23861 (merged 2026-05-29, "only reserves logits space for
    n_seqs when possible"), where it is one per sequence (n_seqs = 1 with a unified cache)."""
    if server.server == "llama-server" and (not ctx.version or ctx.version >= LOGITS_PER_SEQ_FROM):
        return 1 if server.unified else server.slots
    return server.n_ubatch


def compute_buffer(ctx: Context, server: ServerSetup, share_bytes: int) -> Component:
    """The main device's compute buffer: the largest graph phase that runs there
    (engines/llamacpp_placement.py), plus the calibratable scratch."""
    constants, key = ctx.constants, "llamacpp_compute_scratch_bytes"
    outputs = reserved_outputs(ctx, server)
    rel = constants.band(key)
    scratch = constants[key] if share_bytes else 0  # no graph runs on a device without layers
    return band(
        "activation_peak",
        share_bytes + scratch,
        rel,
        rel,
        constants.provenance(key),
        f"compute buffer for n_ubatch {server.n_ubatch}: the largest of the attention"
        + ("" if server.flash_attn else " (KQ matrix of n_kv x n_ubatch x heads, no flash attention)")
        + f", feed-forward and output phases (logits for {outputs} rows)",
    )


def graph_phases(ctx: Context, server: ServerSetup, kv_size: int) -> place.Phases:
    """The compute graph's phases for this server: the cells one attention reads, the ubatch, the logits."""
    n_kv = graph_n_kv(ctx, server, kv_size)
    return place.phases(ctx.model, n_kv, server.n_ubatch, reserved_outputs(ctx, server), server.flash_attn)


def graph_n_kv(ctx: Context, server: ServerSetup, kv_size: int) -> int:
    """The KV cells one attention graph reads: without a unified cache each sequence is its own stream
    (PR #14363), and llama_kv_cache::get_n_kv takes one stream's cells; the ubatch's tokens are split
    over the streams, so the KQ matrix is (a stream's cells) x n_ubatch x heads however many slots
    there are. llama-cpp-python 0.3.36 at n_ctx 2,048 prints a 21.51 MiB compute buffer for one
    sequence and 6.51 MiB for four (512 cells each)."""
    if server.unified or server.slots <= 1 or (ctx.version and ctx.version < KV_STREAMS_FROM):
        return kv_size
    return kv_size // server.slots


__all__ = [
    "KV_STREAMS_FROM",
    "LOGITS_PER_SEQ_FROM",
    "compute_buffer",
    "graph_n_kv",
    "graph_phases",
    "reserved_outputs",
]
