"""SGLang's memory policy (research/capacity-anchors.md §2).

`mem_fraction_static` is the share of the WHOLE card for weights + KV pool:
    rest = free_after_weights - total x (1 - mem_fraction_static);  tokens = rest // cell_size
The remaining `(1 - mem_fraction_static) x total` holds activations, CUDA graphs and runtime.
The default fraction comes from a reservation heuristic that changed in 2025-09 (PR #10975).
"""

from __future__ import annotations

from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.estimate import ENGINE, GIB, Component, Limits, band
from vramlab.capacity.overheads import forward_peak_bytes, moe_workspace_bytes
from vramlab.errors import ConfigError

NEW_HEURISTIC_FROM = (0, 5, 3)
SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio default


def gpu_defaults(ctx: Context) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) defaults by card size and TP."""
    gib = ctx.gpu.memory_gib
    if gib < 35:
        return 2048, (8 if ctx.tp < 4 else 80)
    if gib < 160 and ctx.gpu.arch != "cdna3":
        return 8192, (256 if ctx.tp < 4 else 512)
    return 16384, 512


def default_fraction(ctx: Context, chunk: int, graph_bs: int) -> float:
    gib = ctx.gpu.memory_gib
    world = ctx.tp * ctx.pp
    if ctx.version and ctx.version < NEW_HEURISTIC_FROM:
        if gib < 35:
            reserved = 2.8 + world / 10
        elif gib < 90:
            reserved = 9.5 + world / 2
        elif gib < 160:
            reserved = 12 + world / 2
        else:
            reserved = 32
        return round((gib - reserved) / gib, 3)
    reserved_mib = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + world / 8 * 1024
    reserved_gib = reserved_mib / 1024
    if gib > 60:
        reserved_gib = max(reserved_gib, 10)
    frac = round((gib - reserved_gib) / gib, 3)
    return frac if 0 < frac < 1 else 0.88


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("SGLang")
    m, s, c = ctx.model, ctx.settings, ctx.constants
    chunk_d, bs_d = gpu_defaults(ctx)
    chunk = s.chunked_prefill_size or s.max_num_batched_tokens or chunk_d
    graph_bs = s.cuda_graph_max_bs or bs_d
    frac = s.mem_fraction_static or s.gpu_memory_utilization or default_fraction(ctx, chunk, graph_bs)
    if not 0 < frac < 1:
        raise ConfigError(f"--mem-fraction-static must be in (0, 1), got {frac}")
    context_len = s.max_model_len or ctx.model_max_len
    if not context_len:
        raise ConfigError(f"the context length of {m.name} is unknown: pass --max-model-len (SGLang --context-length)")
    multi = ctx.tp * ctx.pp > 1
    comps: list[Component] = [
        ctx.constant_component("cuda_context", "cuda_context_bytes", "CUDA context and library handles"),
    ]
    if multi:
        comps.append(ctx.nccl_component("NCCL communicators"))
    comps.append(ctx.weights_component())
    # Outside the static pool, inside the (1 - fraction) reservation.
    act = forward_peak_bytes(m, chunk, ctx.tp, ctx.dtype, c) + moe_workspace_bytes(m, chunk, ctx.tp, ctx.dtype, c) \
        + 4 * graph_bs * m.vocab_size  # fp32 logits of a full decode batch
    names = ("forward_intermediate_copies", "forward_hidden_copies")
    comps.append(band("activation_peak", act, c.band(*names) + 0.2, c.band(*names) + 0.2, c.provenance(*names),
                      f"prefill chunk of {chunk} tokens and decode logits for {graph_bs} requests", in_budget=False))
    graphs = 0.0 if s.enforce_eager else c["sglang_graph_bytes_per_bs"] * graph_bs
    if graphs:
        comps.append(band("cuda_graphs", graphs, c.band("sglang_graph_bytes_per_bs"), c.band("sglang_graph_bytes_per_bs"),
                          c.provenance("sglang_graph_bytes_per_bs"),
                          f"decode graphs up to batch {graph_bs}, captured after the pool", in_budget=False))
    total, other = ctx.total, ctx.other
    reserve = int(total * (1 - frac))

    def kv_rule(components: list[Component], point: str) -> int:
        # free after weights (min over ranks), less the reservation; only context, NCCL and weights count.
        return total - other - pick(components, point, ("cuda_context", "nccl", "weights")) - reserve

    shapes = ctx.kv_shapes()
    cell = sum(sh.layers * sh.bytes_per_token_layer for sh in shapes)
    full = sum(sh.layers * sh.bytes_per_token_layer for sh in shapes if sh.kind == "full")
    swa = cell - full
    state = ctx.state_bytes_per_seq()

    def limits(kv_bytes: int) -> Limits:
        rest = max(0, kv_bytes)
        if state:  # Mamba-ish models carve out the state pool first (mamba_full_memory_ratio ~ 0.9)
            rest = int(rest / 1.9)
        if swa and full:
            # Hybrid SWA pool: full-layer tokens = rest / (F + r x S) with r = swa_full_tokens_ratio.
            tokens = int(rest // (full + SWA_FULL_TOKENS_RATIO * swa))
        else:
            tokens = int(rest // cell) if cell else 0
        return Limits(int(kv_bytes), tokens, tokens, tokens / context_len)

    max_running = min(max(int(limits(kv_rule(comps, "mid")).kv_cache_tokens / context_len * 512), 2048), 4096)
    notes = [f"mem_fraction_static {frac} keeps {reserve / GIB:.2f} GiB for activations, CUDA graphs and runtime"]
    reasons = []
    if act + graphs > reserve:
        reasons.append(f"activations and CUDA graphs ({(act + graphs) / GIB:.2f} GiB) exceed the "
                       f"{reserve / GIB:.2f} GiB that mem_fraction_static {frac} leaves: lower it")
    return PolicyResult(
        components=comps, budget_bytes=int(total * frac), kv_rule=kv_rule, limits=limits,
        max_model_len=context_len, block_size=1, kv_bytes_per_token=cell,
        settings={"mem_fraction_static": frac, "chunked_prefill_size": chunk, "cuda_graph_max_bs": graph_bs,
                  "context_length": context_len, "max_running_requests": s.max_num_seqs or max_running,
                  "tp_size": ctx.tp, "pp_size": ctx.pp, "dtype": ctx.dtype, "kv_cache_dtype": s.kv_cache_dtype},
        kv_provenance=ENGINE,
        kv_note=f"free memory after weights less (1 - {frac}) x total, in cells of {cell} bytes",
        per_sequence_state_bytes=state, reasons=reasons, notes=notes, min_blocks_needed=context_len,
        extra={"cell_size_bytes": cell, "reserved_bytes": reserve},
    )
