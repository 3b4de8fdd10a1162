"""Ollama's own offload decision: how many layers it puts on the GPUs and its memory estimate.

Ollama (the llama.cpp runner, releases up to the 2025 estimator) does not ask llama.cpp what fits:
it estimates, then starts the runner with `--n-gpu-layers` set to its answer. This mirrors
ollama/ollama `llm/memory.go` `estimateGPULayers` and `fs/ggml/ggml.go` `GraphSize` at v0.11.6 (the
same arithmetic as v0.5.7's `EstimateGPULayers`, which walked the layers in the other direction):

- KV per layer: `num_ctx x num_parallel x (head_dim_k + head_dim_v) x kv_heads x bytes` (f16 = 2;
  q8_0 = 1 and q4_0 = 0.5 only with OLLAMA_FLASH_ATTENTION=1 and a model that supports it, from
  OLLAMA_KV_CACHE_TYPE); gemma3's sliding layers hold `num_parallel x window + batch` cells;
- the graph, `full` and `partial`, from per-architecture formulas over batch = min(num_ctx, 512),
  context = num_ctx x num_parallel, embedding, heads and vocabulary (llama, qwen2, gemma*,
  deepseek2); other architectures use `partial = heads / kv_heads x kv_total / 6`; several GPUs
  always use the partial graph;
- each GPU must first hold `OLLAMA_GPU_OVERHEAD + graph + 457 MiB (cudaMinimumMemory) + 2 x layer`;
  it then takes 457 MiB + one layer (blk.0 + its KV) as a buffer, and layers (their weights and KV)
  are dealt from the last one down while `free > overhead + allocated + graph + layer`;
  `num_gpu` (-ngl) stops it early; the output layer (output_norm + output, or token_embd when tied)
  is placed last, then every GPU with layers adds the full graph (all layers placed) or the partial;
- `memory.required.partial` = the GPUs' allocations, `memory.required.full` = that plus what did
  not fit; `memory.weights.total` = the repeating layers + the output layer.

num_ctx defaults to OLLAMA_CONTEXT_LENGTH (2048 before v0.6.8, 4096 since), num_parallel to
OLLAMA_NUM_PARALLEL (from v0.10.0 1; before, 0 meant 4 when the model fits fully with 4, else 1).
A vision projector's weights and graph are not modelled (noted when the model has a vision tower).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vramlab.capacity import gguf_mix
from vramlab.capacity.engines import llamacpp_placement as place
from vramlab.capacity.engines import ollama_server as server
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.engines.ollama_graph import BATCH, flash_attention, graph_sizes, projector
from vramlab.capacity.estimate import FORMULA, Component, Limits, band

MIB = 1 << 20
MINIMUM_MEMORY = 457 * MIB  # discover/gpu.go cudaMinimumMemory / rocmMinimumMemory
PARALLEL_ONE_FROM = (0, 10, 0)
LAST_LAYER_FIRST_FROM = (0, 7, 0)  # v0.6.8 walked blk.0 upwards; v0.7.0 from the last layer down
KV_BYTES = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5}


@dataclass
class Decision:
    """What Ollama logs in its `msg=offload` line, in bytes."""

    layers_model: int
    layers_offload: int
    split: list[int]
    available: list[int]
    allocations: list[int]
    required_full: int
    required_partial: int
    kv_total: int
    weights_repeating: int
    weights_nonrepeating: int
    graph_full: int
    graph_partial: int
    offloaded_weights: int = 0
    offloaded_kv: int = 0
    projector_weights: int = 0
    projector_graph: int = 0
    notes: list[str] = field(default_factory=list)


def _layers(ctx: Context) -> tuple[list[int], int]:
    """Each blk's bytes and the output layer's (output_norm + output, token_embd when tied). A vision
    tower is a separate projector file in Ollama: the text model's blocks alone."""
    from dataclasses import replace

    from vramlab.capacity.engines.llamacpp import weights_on_device

    if ctx.model.vision_params:
        ctx = Context(replace(ctx.model, vision_params=0, vision=None), ctx.gpu, ctx.settings, ctx.constants)
    m = ctx.model
    ftype = ctx.quant.gguf_type if ctx.quant is not None and ctx.quant.method == "gguf" else None
    device = weights_on_device(ctx).bytes
    embedding = (
        gguf_mix.host_embedding_bytes(m, ftype)
        if ftype and gguf_mix.supported(m, ftype)
        else int(m.vocab_size * m.hidden_size * device / max(1, _params(ctx)))
    )
    tensors, _ = place.model_tensors(m, ftype, device, embedding)
    blocks = [0] * m.num_layers
    output = 0
    for t in tensors:
        if 0 <= t.layer < m.num_layers:
            blocks[t.layer] += t.bytes
        elif t.layer == m.num_layers:
            output += t.bytes
    if m.tie_word_embeddings:
        output = embedding + 4 * m.hidden_size
    return blocks, output


def _params(ctx: Context) -> int:
    from vramlab.capacity.weights import breakdown

    return breakdown(ctx.model, ctx.tp, ctx.pp, 0).total_params


def _deal_layers(
    blocks: list[int], kv: list[int], free: list[int], reserve: int, num_gpu: int, backwards: bool
) -> tuple[list[int], list[int], list[int], tuple[int, int, int, int]]:
    """The cards that can take a layer at all, then the layers dealt over them (`i % cards`); *reserve* is
    OLLAMA_GPU_OVERHEAD plus the graph. Returns allocations, layers per card, the cards still with space
    and (layers placed, overflow, weights placed, KV placed)."""
    n = len(blocks)
    layer = blocks[0] + kv[0]
    alloc, split, with_space = [0] * len(free), [0] * len(free), []
    for i, f in enumerate(free):
        if f < reserve + MINIMUM_MEMORY + 2 * layer:
            continue
        with_space.append(i)
        alloc[i] += MINIMUM_MEMORY + layer
    count = overflow = weights_on = kv_on = 0
    for i in range(n - 1, -1, -1) if backwards else range(n):
        layer = blocks[i] + kv[i]
        if 0 <= num_gpu <= count:
            overflow += layer if backwards else 0
            continue
        for j in range(len(with_space), 0, -1):
            g = with_space[i % j]
            if free[g] > reserve + alloc[g] + layer:
                alloc[g] += layer
                split[g] += 1
                count += 1
                weights_on += blocks[i]
                kv_on += kv[i]
                break
            with_space.pop(i % j)
        if not with_space and backwards:
            overflow += layer
    if not backwards and count < n:  # v0.6.8 and before: the missing layers at the last layer's size
        overflow += (n - count) * (blocks[-1] + kv[-1])
    return alloc, split, with_space, (count, overflow, weights_on, kv_on)


def decide(ctx: Context, free: list[int], num_ctx: int, parallel: int, kv_type: str) -> Decision:
    """`estimateGPULayers` over the cards' free memory."""
    s = ctx.settings
    blocks, output = _layers(ctx)
    proj_weights, proj_graph = projector(ctx)
    last_layer = output + proj_weights + proj_graph  # the projector is placed with the output layer
    kv, partial, full = graph_sizes(ctx, num_ctx, parallel, KV_BYTES.get(kv_type, 2.0))
    if len(free) > 1:
        full = partial
    graph = max(partial, full)
    overhead = s.ollama_gpu_overhead_bytes
    n, num_gpu = len(blocks), (-1 if s.n_gpu_layers is None else s.n_gpu_layers)
    alloc, split, with_space, (count, overflow, weights_on, kv_on) = _deal_layers(
        blocks, kv, free, overhead + graph, num_gpu, not ctx.version or ctx.version >= LAST_LAYER_FIRST_FROM
    )
    fully = count >= n
    if num_gpu < 0 or count < num_gpu:
        for j in range(len(with_space), 0, -1):
            g = with_space[count % j]
            if free[g] > overhead + alloc[g] + graph + last_layer:
                alloc[g] += last_layer
                split[g] += 1
                count += 1
                weights_on += output
                break
    if count < n + 1:
        fully = False
        overflow += last_layer
    for i in range(len(free)):
        if split[i] > 0:
            alloc[i] += full if fully else partial
    if not count:
        alloc = [0] * len(free)
    partial_total = sum(alloc)
    return Decision(
        n + 1,
        count,
        split,
        free,
        alloc,
        partial_total + overflow,
        partial_total,
        sum(kv),
        sum(blocks),
        output,
        full,
        partial,
        weights_on,
        kv_on,
        proj_weights,
        proj_graph,
    )


def resolve(ctx: Context) -> tuple[int, int, str, bool, list[str]]:
    """num_ctx, num_parallel, KV cache type and flash attention as Ollama resolves them."""
    s, m, notes = ctx.settings, ctx.model, []
    num_ctx = s.max_model_len or 0
    if not num_ctx:
        num_ctx, rule = server.default_num_ctx(ctx)
        notes.append(f"num_ctx {num_ctx:,}: {rule}")
    if m.vision_params:
        num_ctx = max(num_ctx, 2048)  # multimodal models require at least 2048 context (server/sched.go)
        if not m.model_type.startswith("gemma3"):
            notes.append(
                "the vision projector's weights and graph are modelled for gemma3 only: Ollama adds them "
                "to the GPU that takes the output layer"
            )
    trained = m.context_length
    if trained and num_ctx > trained:
        notes.append(
            f"requested context size too large for model (num_ctx {num_ctx} > n_ctx_train {trained}): "
            f"Ollama uses {trained}"
        )
        num_ctx = trained
    flash, flash_notes = flash_attention(ctx)
    notes += flash_notes
    requested = (s.kv_cache_dtype or "").lower()
    kv_type = requested if flash and requested in ("q8_0", "q4_0") else "f16"
    if requested in ("q8_0", "q4_0") and not flash:
        notes.append(f"quantized kv cache requested but flash attention disabled ({requested}): f16")
    parallel = s.parallel or 1
    return num_ctx, parallel, kv_type, flash, notes


def _cards(ctx: Context) -> list[tuple[str, int]]:
    return list(ctx.settings.devices) or [(ctx.gpu.name, ctx.total)]


def _fewest_cards(ctx: Context, free: list[int], num_ctx: int, parallel: int, kv_type: str) -> Decision:
    """`pickBestFullFitByLibrary`: the cards by free memory, most first; the fewest that hold every layer
    (without OLLAMA_SCHED_SPREAD), else all of them. Cards left out keep a zero allocation."""
    order = sorted(range(len(free)), key=lambda i: -free[i])
    for k in range(1, len(free)):
        d = decide(
            ctx, [free[i] if i in order[:k] else 0 for i in range(len(free))], num_ctx, parallel, kv_type
        )
        if d.layers_offload >= d.layers_model:
            d.available = free
            return d
    return decide(ctx, free, num_ctx, parallel, kv_type)


def plan(ctx: Context) -> PolicyResult:
    num_ctx, parallel, kv_type, flash, notes = resolve(ctx)
    if ctx.version and ctx.version >= server.LLAMA_SERVER_FROM:
        return server.plan(ctx, num_ctx, parallel, notes)
    if ctx.version and ctx.version > server.ESTIMATOR_LAST:
        notes.append(
            f"unknown term: Ollama {ctx.settings.resolved_version} places layers from what its runner "
            "allocates (llm/memory.go's estimator was removed in v0.12.11); planned with the v0.11.6 estimator"
        )
    cards = _cards(ctx)
    free = [max(0, total - ctx.other) for _, total in cards]
    if not ctx.settings.parallel and ctx.version and ctx.version < PARALLEL_ONE_FROM:
        four = decide(ctx, free, num_ctx, 4, kv_type)
        parallel = 4 if four.layers_offload >= four.layers_model else 1
        notes.append(
            f"OLLAMA_NUM_PARALLEL unset before v0.10.0: {parallel} (4 when the model fits fully with 4)"
        )
    d = _fewest_cards(ctx, free, num_ctx, parallel, kv_type)
    # the components are card 0's: its graph only when it holds layers (the others' are in `ollama`)
    graph = (d.graph_full if d.layers_offload >= d.layers_model else d.graph_partial) if d.split[0] else 0
    kv_share = d.offloaded_kv if len(cards) == 1 else int(d.offloaded_kv * d.split[0] / max(1, sum(d.split)))
    # Layers that do not fit run on the CPU: Ollama still serves the model (the plan's verdict says
    # "runs with part of the model on the CPU", capacity/verdict.py), so that is no refusal here.
    notes += _cards_left_out(cards, d)

    def kv_rule(components: list[Component], point: str) -> int:
        return kv_share

    def limits(kv: int) -> Limits:
        return Limits(kv, num_ctx * parallel, num_ctx * parallel, float(parallel))

    return PolicyResult(
        components=_components(ctx, d, graph, kv_share),
        budget_bytes=free[0],
        kv_rule=kv_rule,
        limits=limits,
        max_model_len=num_ctx,
        block_size=1,
        # this GPU's share: the KV of the layers it holds, not every layer's (`memory.required.kv`)
        kv_bytes_per_token=int(kv_share / max(1, num_ctx * parallel)),
        settings={
            "num_ctx": num_ctx,
            "num_parallel": parallel,
            "flash_attention": flash,
            "kv_cache_type": kv_type,
            "num_batch": BATCH,
            "num_gpu": d.layers_offload,
            "devices": len(cards),
            "quantization": ctx.quant.gguf_type or ctx.quant.method if ctx.quant else None,
        },
        kv_provenance=FORMULA,
        kv_note=f"Ollama's estimate: num_ctx {num_ctx} x {parallel} x (K + V) x kv heads in {kv_type}, offloaded layers",
        kv_fixed=True,
        notes=notes,
        extra={"ollama": _offload_line(ctx, d)},
    )


def _cards_left_out(cards: list[tuple[str, int]], d: Decision) -> list[str]:
    """Cards holding no layer: where the model went instead (the table shows card 0)."""
    empty = [i for i, n in enumerate(d.split) if not n]
    if not empty or len(cards) < 2:
        return []
    held = ", ".join(f"{n} on card {i} ({cards[i][0]})" for i, n in enumerate(d.split) if n)
    names = ", ".join(f"card {i} ({cards[i][0]})" for i in empty)
    why = (
        "Ollama loads a model on the fewest cards that hold every layer, most free memory first "
        "(pickBestFullFitByLibrary)"
        if d.layers_offload >= d.layers_model
        else "no layer fits beside the graph and Ollama's 457 MiB minimum there"
    )
    return [
        f"{names} hold no layer of the model: {why}; the layers went {held or 'nowhere on a GPU'}"
        + (f", {d.layers_model - d.layers_offload} to the CPU" if d.layers_offload < d.layers_model else "")
        + (" (the component table above is card 0's)" if not d.split[0] else "")
    ]


def _components(ctx: Context, d: Decision, graph: int, kv_share: int) -> list[Component]:
    """The first GPU's share of Ollama's estimate: its minimum, the layers' weights, the graph, the overhead."""
    weights_share = (
        d.allocations[0] - (MINIMUM_MEMORY if d.split[0] else 0) - graph - kv_share if d.split[0] else 0
    )
    comps: list[Component] = [
        band(
            "cuda_context",
            MINIMUM_MEMORY if d.split[0] else 0,
            0.0,
            0.0,
            FORMULA,
            "Ollama's per-GPU minimum (cudaMinimumMemory, 457 MiB), standing in for the CUDA context",
        ),
        band(
            "weights",
            max(0, weights_share),
            0.02,
            0.02,
            FORMULA,
            f"the {d.split[0]} layers Ollama offloads to this GPU (one layer more is reserved as a buffer)",
        ),
        band(
            "activation_peak",
            graph,
            0.0,
            0.0,
            FORMULA,
            "Ollama's graph estimate (full when every layer is offloaded, else partial)",
        ),
    ]
    if ctx.settings.ollama_gpu_overhead_bytes:
        comps.append(
            band(
                "other",
                ctx.settings.ollama_gpu_overhead_bytes,
                0.0,
                0.0,
                FORMULA,
                "OLLAMA_GPU_OVERHEAD held back per GPU",
            )
        )
    return comps


def _offload_line(ctx: Context, d: Decision) -> dict[str, object]:
    """What Ollama's `msg=offload` log line prints, in bytes."""
    return {
        "layers_model": d.layers_model,
        "layers_offload": d.layers_offload,
        "layers_split": d.split,
        "memory_available_bytes": d.available,
        "memory_required_full_bytes": d.required_full,
        "memory_required_partial_bytes": d.required_partial,
        "memory_required_kv_bytes": d.kv_total,
        "memory_required_allocations_bytes": d.allocations,
        "memory_weights_total_bytes": d.weights_repeating + d.weights_nonrepeating,
        "memory_weights_repeating_bytes": d.weights_repeating,
        "memory_weights_nonrepeating_bytes": d.weights_nonrepeating,
        "memory_graph_full_bytes": d.graph_full,
        "memory_graph_partial_bytes": d.graph_partial,
        "projector_weights_bytes": d.projector_weights,
        "projector_graph_bytes": d.projector_graph,
        "num_gpu": d.layers_offload,
        "gpu_overhead_bytes": ctx.settings.ollama_gpu_overhead_bytes,
    }


def full_offload(est: Any) -> bool:
    """Ollama's `PredictServerFit`: every layer and the output on the GPUs."""
    o = est.extra.get("ollama")
    if o is None:  # the llama-server era, planned as llama.cpp: no layer and no output left on the host
        host = est.extra.get("host") or {}
        return not host.get("layers") and not host.get("output_layer")
    return bool(o["layers_offload"] >= o["layers_model"])


def suggest(model: Any, gpu: Any, s: Any, constants: Any, est: Any) -> list[str]:
    """Changes that make Ollama offload every layer, each checked by re-planning: a shorter num_ctx,
    one parallel sequence, a q8_0 KV cache with flash attention."""
    from vramlab.capacity.model import estimate
    from vramlab.errors import ConfigError

    out: list[str] = []

    def full(**changes: Any) -> bool:
        try:
            return full_offload(estimate(model, gpu, s.with_(**changes), constants, with_suggestions=False))
        except ConfigError:
            return False

    longest = _longest_full_context(full, int(est.max_model_len))
    if longest:
        out.append(
            f"lower num_ctx to {longest:,} (OLLAMA_CONTEXT_LENGTH={longest} or the request's options.num_ctx)"
        )
    if (s.parallel or 1) > 1 and full(parallel=1):
        out.append("serve one request at a time (OLLAMA_NUM_PARALLEL=1)")
    if s.kv_cache_dtype in ("auto", "f16", None) and full(kv_cache_dtype="q8_0", flash_attn=True):
        out.append("use a q8_0 KV cache (OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0)")
    if not out:
        out.append(
            "no single change offloads every layer on this card: a smaller quantization or a larger GPU"
        )
    return out


def _longest_full_context(full: Any, now: int) -> int:
    """The longest num_ctx below *now* at which every layer is offloaded (0: none of at least 256)."""
    lo, hi = 0, now
    if not full(max_model_len=256):
        return 0
    lo = 256
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if full(max_model_len=mid):
            lo = mid
        else:
            hi = mid
    return lo - lo % 16 if lo > 4096 else lo
