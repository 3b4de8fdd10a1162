"""Text-generation-inference's memory policy (research/capacity-anchors.md §4).

Warm-up runs the largest prefill batch (`--max-batch-prefill-tokens`), then sizes the KV pool
from what is free after that peak, keeping `1 - CUDA_MEMORY_FRACTION x TGI_WIGGLE_ROOM` (10 %)
of the card: KV = free_after_peak - 0.10 x total. CUDA graphs are captured afterwards, inside
that wiggle room.
"""

from __future__ import annotations

from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.estimate import ENGINE, GIB, Component, Limits, band
from vramlab.capacity.overheads import forward_peak_bytes, moe_workspace_bytes
from vramlab.errors import ConfigError

WIGGLE_ROOM = 0.90  # TGI_WIGGLE_ROOM
FLASHINFER_FROM = (3, 0)  # TGI 3 defaults to flashinfer with block size 1


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("TGI")
    m, s, c = ctx.model, ctx.settings, ctx.constants
    max_total = s.max_model_len or ctx.model_max_len
    if not max_total:
        raise ConfigError(f"the context length of {m.name} is unknown: pass --max-model-len (TGI --max-total-tokens)")
    prefill = s.max_batch_prefill_tokens or s.max_num_batched_tokens or 4096
    util = s.gpu_memory_utilization or 1.0  # CUDA_MEMORY_FRACTION
    block = s.block_size or (1 if not ctx.version or ctx.version >= FLASHINFER_FROM else 16)
    comps: list[Component] = [
        ctx.constant_component("cuda_context", "cuda_context_bytes", "CUDA context and library handles"),
    ]
    if ctx.tp > 1:
        comps.append(ctx.nccl_component("NCCL communicators"))
    comps.append(ctx.weights_component())
    per_tok = c["tgi_prefill_bytes_per_token_hidden"] * m.hidden_size
    act = max(forward_peak_bytes(m, prefill, ctx.tp, ctx.dtype, c), prefill * per_tok) \
        + moe_workspace_bytes(m, prefill, ctx.tp, ctx.dtype, c)
    comps.append(band("activation_peak", act, c.band("tgi_prefill_bytes_per_token_hidden"),
                      c.band("tgi_prefill_bytes_per_token_hidden"), c.provenance("tgi_prefill_bytes_per_token_hidden"),
                      f"warm-up prefill of --max-batch-prefill-tokens {prefill}"))
    graphs = 0.0 if s.enforce_eager else c["cuda_graph_base_bytes"] + c["cuda_graph_per_layer_bytes"] * m.num_layers / 2
    if graphs:
        comps.append(band("cuda_graphs", graphs, 0.6, 0.6, c.provenance("cuda_graph_base_bytes"),
                          "graphs for the default batch sizes, captured after the KV pool", in_budget=False))
    total, other = ctx.total, ctx.other
    keep = int(total * (1 - util * WIGGLE_ROOM))

    def kv_rule(components: list[Component], point: str) -> int:
        return total - other - pick(components, point) - keep

    per_token = ctx.kv_bytes_per_token()

    def limits(kv_bytes: int) -> Limits:
        blocks = max(0, kv_bytes) // max(1, per_token * block)
        tokens = blocks * block
        return Limits(int(kv_bytes), int(tokens), int(blocks), tokens / max_total)

    reasons = []
    if graphs > keep:
        reasons.append(f"CUDA graphs ({graphs / GIB:.2f} GiB) do not fit the {keep / GIB:.2f} GiB wiggle room")
    return PolicyResult(
        components=comps, budget_bytes=total - keep, kv_rule=kv_rule, limits=limits, max_model_len=max_total,
        block_size=block, kv_bytes_per_token=per_token,
        settings={"max_total_tokens": max_total, "max_batch_prefill_tokens": prefill, "cuda_memory_fraction": util,
                  "block_size": block, "num_shard": ctx.tp, "dtype": ctx.dtype},
        kv_provenance=ENGINE, kv_note="free memory after the warm-up peak less 10 % of the card (TGI_WIGGLE_ROOM)",
        reasons=reasons, min_blocks_needed=-(-max_total // block),
        notes=["max_batch_total_tokens is the pool in tokens; TGI sizes it at warm-up"],
    )
