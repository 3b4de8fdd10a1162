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


def warmup_components(ctx: Context, prefill_tokens: int) -> list[Component]:
    """Everything but the KV pool: context, NCCL, weights, the warm-up prefill peak, CUDA graphs."""
    model, settings, constants = ctx.model, ctx.settings, ctx.constants
    components: list[Component] = [
        ctx.constant_component("cuda_context", "cuda_context_bytes", "CUDA context and library handles"),
    ]
    if ctx.tp > 1:
        components.append(ctx.nccl_component("NCCL communicators"))
    components.append(ctx.weights_component())
    key = "tgi_prefill_bytes_per_token_hidden"
    per_prefill_token = constants[key] * model.hidden_size
    activation = max(forward_peak_bytes(model, prefill_tokens, ctx.tp, ctx.dtype, constants),
                     prefill_tokens * per_prefill_token) \
        + moe_workspace_bytes(model, prefill_tokens, ctx.tp, ctx.dtype, constants)
    components.append(band("activation_peak", activation, constants.band(key), constants.band(key),
                           constants.provenance(key), f"warm-up prefill of --max-batch-prefill-tokens {prefill_tokens}"))
    graphs = 0.0 if settings.enforce_eager else \
        constants["cuda_graph_base_bytes"] + constants["cuda_graph_per_layer_bytes"] * model.num_layers / 2
    if graphs:
        components.append(band("cuda_graphs", graphs, 0.6, 0.6, constants.provenance("cuda_graph_base_bytes"),
                               "graphs for the default batch sizes, captured after the KV pool", in_budget=False))
    return components


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("TGI")
    settings = ctx.settings
    max_total = settings.max_model_len or ctx.model_max_len
    if not max_total:
        raise ConfigError(f"the context length of {ctx.model.name} is unknown: pass --max-model-len "
                          "(TGI --max-total-tokens)")
    prefill_tokens = settings.max_batch_prefill_tokens or settings.max_num_batched_tokens or 4096
    memory_fraction = settings.gpu_memory_utilization or 1.0  # CUDA_MEMORY_FRACTION
    block = settings.block_size or (1 if not ctx.version or ctx.version >= FLASHINFER_FROM else 16)
    components = warmup_components(ctx, prefill_tokens)
    graphs = sum(c.bytes for c in components if c.name == "cuda_graphs")
    total, other = ctx.total, ctx.other
    wiggle_room = int(total * (1 - memory_fraction * WIGGLE_ROOM))

    def kv_rule(parts: list[Component], point: str) -> int:
        return total - other - pick(parts, point) - wiggle_room

    per_token = ctx.kv_bytes_per_token()

    def limits(kv_bytes: int) -> Limits:
        blocks = max(0, kv_bytes) // max(1, per_token * block)
        tokens = blocks * block
        return Limits(int(kv_bytes), int(tokens), int(blocks), tokens / max_total)

    reasons = []
    if graphs > wiggle_room:
        reasons.append(f"CUDA graphs ({graphs / GIB:.2f} GiB) do not fit the {wiggle_room / GIB:.2f} GiB wiggle room")
    return PolicyResult(
        components=components, budget_bytes=total - wiggle_room, kv_rule=kv_rule, limits=limits,
        max_model_len=max_total, block_size=block, kv_bytes_per_token=per_token,
        settings={"max_total_tokens": max_total, "max_batch_prefill_tokens": prefill_tokens,
                  "cuda_memory_fraction": memory_fraction, "block_size": block, "num_shard": ctx.tp,
                  "dtype": ctx.dtype},
        kv_provenance=ENGINE, kv_note="free memory after the warm-up peak less 10 % of the card (TGI_WIGGLE_ROOM)",
        reasons=reasons, min_blocks_needed=-(-max_total // block),
        notes=["max_batch_total_tokens is the pool in tokens; TGI sizes it at warm-up"],
    )
