"""vLLM's memory policy, by era (research/capacity-anchors.md §1).

- Budget: `gpu_memory_utilization x total` of the WHOLE card (or `--kv-cache-memory`).
- KV = budget - (weights + activation peak + non-torch increase) [- CUDA-graph estimate, V1 >= 0.21].
- V1 (default from 0.8) takes its baseline snapshot after the CUDA context and, from ~0.10,
  after NCCL init, so those sit outside the budget; graphs captured after the KV allocation
  (< 0.21) must fit in the `1 - util` headroom.
- Blocks are the minimum over ranks; concurrency = blocks / blocks one max_model_len request needs.
"""

from __future__ import annotations

import math

from vramlab.capacity import pool
from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.estimate import DEFAULT, ENGINE, GIB, Component, Limits, band
from vramlab.capacity.overheads import (
    cuda_graph_bytes,
    forward_peak_bytes,
    moe_workspace_bytes,
    sampler_peak_bytes,
    vllm_capture_sizes,
)
from vramlab.errors import ConfigError

V1_DEFAULT_FROM = (0, 8)
V0_REMOVED_IN = (0, 11)
NCCL_BEFORE_SNAPSHOT_FROM = (0, 10)
GRAPH_ESTIMATE_FROM = (0, 21)
UTIL_092_FROM = (0, 22)
BATCH_DEFAULTS_BY_GPU_FROM = (0, 9)
TOKENS_AS_CONCURRENCY_FROM = (0, 27)


def engine_kind(ctx: Context) -> str:
    v, asked = ctx.version, (ctx.s.vllm_engine or "").lower()
    if asked == "v0" and v and v >= V0_REMOVED_IN:
        raise ConfigError(f"vLLM {ctx.s.engine_version} has no V0 engine (removed in 0.11)")
    if asked in ("v0", "v1"):
        return asked
    return "v1" if not v or v >= V1_DEFAULT_FROM else "v0"


def defaults(ctx: Context, kind: str) -> tuple[float, int, int]:
    """(gpu_memory_utilization, max_num_seqs, max_num_batched_tokens) as vLLM would pick them."""
    s, v = ctx.s, ctx.version
    util = s.gpu_memory_utilization or (0.92 if v and v >= UTIL_092_FROM else 0.9)
    if kind == "v0":
        seqs = s.max_num_seqs or 256
        mbt = s.max_num_batched_tokens or max(ctx_len(ctx), 2048)
        return util, seqs, mbt
    big = ctx.gpu.memory_gib >= 70 and not ctx.gpu.is_a100
    if v and v < BATCH_DEFAULTS_BY_GPU_FROM:
        seqs_d, mbt_d = 256, (2048 if s.api_server else 8192)
    elif big:
        seqs_d, mbt_d = 1024, (8192 if s.api_server else 16384)
    else:
        seqs_d, mbt_d = 256, (2048 if s.api_server else 8192)
    return util, s.max_num_seqs or seqs_d, s.max_num_batched_tokens or mbt_d


def ctx_len(ctx: Context) -> int:
    length = ctx.s.max_model_len or ctx.model_max_len
    if not length:
        raise ConfigError(f"the context length of {ctx.model.name} is unknown (no max_position_embeddings "
                          "in its config): pass --max-model-len")
    return length


def sampler_key(kind: str, v: tuple[int, ...]) -> str:
    """Which sampler constant applies: the sampler's temporaries changed size twice."""
    if kind == "v0" or (v and (0, 15) <= v < (0, 17)):
        return "legacy_sampler_bytes_per_seq_vocab"
    if v and v < (0, 15):
        return "early_v1_sampler_bytes_per_seq_vocab"
    return "sampler_bytes_per_seq_vocab"


def nvls(ctx: Context) -> bool:
    """NCCL NVLink-SHARP buffers exist on NVSwitch systems of Hopper and Blackwell cards."""
    return ctx.gpu.arch in ("hopper", "blackwell") and "pcie" not in ctx.gpu.name and ctx.gpu.nominal_gb >= 80


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("vLLM")
    m, s, c = ctx.model, ctx.s, ctx.c
    kind = engine_kind(ctx)
    util, seqs, mbt = defaults(ctx, kind)
    if not 0 < util <= 1:
        raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    max_len = ctx_len(ctx)
    if ctx.model_max_len and max_len > ctx.model_max_len:
        raise ConfigError(
            f"vLLM: user-specified max_model_len ({max_len}) is greater than the derived max_model_len "
            f"({ctx.model_max_len}, max_position_embeddings of {m.name})")
    v = ctx.version
    nccl_outside = kind == "v1" and (not v or v >= NCCL_BEFORE_SNAPSHOT_FROM)
    graphs_in_budget = kind == "v1" and (not v or v >= GRAPH_ESTIMATE_FROM) and not s.enforce_eager
    multi = ctx.tp * ctx.pp > 1

    def stage_components(stage: int) -> list[Component]:
        last = stage == ctx.pp - 1
        comps = [ctx.constant_component("cuda_context", "cuda_context_bytes",
                                        "CUDA context and library handles, before vLLM's baseline snapshot",
                                        in_budget=False)]
        if multi:
            comps.append(ctx.constant_component("nccl", "nccl_init_bytes", "NCCL communicators created at start-up"
                              + ("; outside the budget since V1 inits them before the snapshot"
                                 if nccl_outside else "; inside the profiling window"),
                              in_budget=not nccl_outside))
        comps.append(ctx.weights_component(stage))
        fwd = forward_peak_bytes(m, mbt, ctx.tp, ctx.dtype, c)
        key = sampler_key(kind, v)
        samp = sampler_peak_bytes(m, min(seqs, mbt), c, key) if last else 0.0
        moe = moe_workspace_bytes(m, mbt, ctx.tp, ctx.dtype, c)
        act = max(fwd, samp) + moe
        names = [key, "forward_intermediate_copies", "forward_hidden_copies"] + (["moe_workspace_copies"] if moe else [])
        rel = c.band(*names) + (0.25 if m.vision_params else 0.0)
        note = (f"dummy forward at max_num_batched_tokens={mbt}"
                + (f" and sampler on {min(seqs, mbt)} sequences x {m.vocab_size} vocab (fp32)" if last else "")
                + (" + fused-MoE workspace" if moe else "")
                + ("; multimodal encoder profiling not modelled" if m.vision_params else ""))
        comps.append(band("activation_peak", act, rel, rel, c.provenance(*names), note))
        if kind == "v0":
            nt_key = "v0_non_torch_tp_bytes" if multi else "v0_non_torch_bytes"
        elif ctx.tp > 1:
            nt_key = "non_torch_forward_tp_bytes" if nvls(ctx) else "non_torch_forward_tp_nonvls_bytes"
        elif ctx.pp > 1:
            nt_key = "non_torch_forward_pp_bytes"
        else:
            nt_key = "non_torch_forward_bytes"
        comps.append(ctx.constant_component("non_torch", nt_key,
                                            "memory outside PyTorch that grows during profiling"
                          + (" (custom all-reduce / NCCL buffers)" if ctx.tp > 1 else " (cuBLAS/Triton workspaces)")))
        if not s.enforce_eager:
            layers_local = len(ctx.layer_range(stage))
            cg = cuda_graph_bytes(m, layers_local, vllm_capture_sizes(seqs), c)
            if graphs_in_budget:
                cg *= c["cuda_graph_estimate_ratio"]
            names_cg = ("cuda_graph_base_bytes", "cuda_graph_per_layer_bytes")
            comps.append(band("cuda_graphs", cg, c.band(*names_cg), c.band(*names_cg), c.provenance(*names_cg),
                              "CUDA graph pool for decode batch sizes"
                              + ("; estimated during profiling and taken from the budget (V1 >= 0.21)"
                                 if graphs_in_budget else
                                 "; captured after the KV cache is allocated, so it must fit in the 1 - util headroom"),
                              in_budget=graphs_in_budget))
        return comps

    stages = [stage_components(i) for i in range(ctx.pp)]
    comps = stages[0]
    fixed_kv = s.kv_cache_memory_bytes
    budget = int(fixed_kv if fixed_kv else util * ctx.total)

    def kv_rule(components: list[Component], point: str) -> int:
        if fixed_kv:
            return int(fixed_kv)
        return budget - pick(components, point)

    # Pool layout per stage; the hybrid manager groups layers by kind.
    layouts, per_token = [], []
    state = ctx.state_bytes_per_seq(0)
    block_size = s.block_size or 16
    for st in range(ctx.pp):
        shapes = ctx.kv_shapes(st)
        rng = ctx.layer_range(st)
        n_state_layers = sum(1 for i in rng if m.kinds[i] in ("mamba", "linear"))
        state_per_layer = ctx.state_bytes_per_seq(st) // max(1, n_state_layers) if n_state_layers else 0
        if n_state_layers and shapes and not s.block_size:
            # vLLM grows the attention block until its page is at least the mamba page.
            attn_tok = max(sh.bytes_per_token_layer for sh in shapes)
            block_size = 16 * math.ceil(state_per_layer / (16 * attn_tok))
        layouts.append((shapes, n_state_layers, state_per_layer))
        per_token.append(sum(sh.layers * sh.bytes_per_token_layer for sh in shapes))
    lays = [pool.layout(sh, block_size, n, spl, hybrid_manager=kind == "v1") for sh, n, spl in layouts]
    offsets = [pick(comps, "mid") - pick(sc, "mid") for sc in stages]  # stage KV = stage-0 KV + offset
    bpr = pool.blocks_per_request(lays[0], max_len, mbt, m.sliding_window, m.attention_chunk_size)
    hybrid = lays[0].num_groups > 1

    def limits(kv_bytes: int) -> Limits:
        blocks = min(pool.num_blocks(max(0, kv_bytes + off), lay) for off, lay in zip(offsets, lays, strict=True))
        if kind == "v0":
            conc = blocks * block_size / max_len
            tokens = blocks * block_size
        else:
            conc = blocks / bpr
            if hybrid and v and v >= TOKENS_AS_CONCURRENCY_FROM:
                tokens = int(conc * max_len)
            elif hybrid:
                tokens = blocks // lays[0].num_groups * block_size
            else:
                tokens = blocks * block_size
        return Limits(int(kv_bytes), int(tokens), int(blocks), conc)

    resolved = {
        "engine_mode": kind, "gpu_memory_utilization": util, "max_num_seqs": seqs,
        "max_num_batched_tokens": mbt, "max_model_len": max_len, "block_size": block_size,
        "tensor_parallel_size": ctx.tp, "pipeline_parallel_size": ctx.pp, "dtype": ctx.dtype,
        "kv_cache_dtype": s.kv_cache_dtype, "quantization": ctx.quant.method if ctx.quant else None,
        "enforce_eager": s.enforce_eager, "kv_cache_memory_bytes": fixed_kv,
    }
    notes = []
    if lays[0].padded_layers:
        waste = lays[0].padded_layers / max(1, lays[0].num_groups * lays[0].group_size)
        notes.append(f"hybrid KV groups: {lays[0].padded_layers} padding layer slots "
                     f"(up to {waste:.1%} of the pool unused), as vLLM logs 'Add N padding layers'")
    if not graphs_in_budget and not s.enforce_eager:
        notes.append("CUDA graphs are captured after the KV cache exists: they need the 1 - util headroom")
    reasons: list[str] = []
    free_at_start = ctx.total - ctx.other - pick(comps, "mid", ("cuda_context",)) \
        - (int(c["nccl_init_bytes"]) if multi and nccl_outside else 0)
    if kind == "v1" and not fixed_kv and free_at_start < budget:
        reasons.append(
            f"Free memory on device ({free_at_start / GIB:.2f}/{ctx.total / GIB:.2f} GiB) on startup is less than "
            f"desired GPU memory utilization ({util}, {budget / GIB:.2f} GiB)")
    return PolicyResult(
        components=comps, budget_bytes=budget, kv_rule=kv_rule, limits=limits, max_model_len=max_len,
        block_size=block_size, kv_bytes_per_token=per_token[0], settings=resolved,
        kv_provenance=ENGINE if not fixed_kv else DEFAULT,
        kv_note=("--kv-cache-memory: fixed by the user" if fixed_kv else
                 f"util x total ({util} x {ctx.total / GIB:.2f} GiB) less the in-budget components"),
        per_sequence_state_bytes=state, reasons=reasons, notes=notes, min_blocks_needed=bpr,
        extra={"blocks_per_request": bpr, "hybrid_groups": [list(g) for g in lays[0].groups]},
    )
