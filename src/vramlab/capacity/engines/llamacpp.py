"""llama.cpp's memory: every slot's KV allocated up front, plus model and compute buffers.

KV = padded cells x layers x (K bytes in --cache-type-k + V bytes in --cache-type-v) (f16 by
default; q8_0 / q4_0 and friends); sliding-window layers of iSWA models hold only the window
plus a ubatch. Without flash attention the compute buffer also holds one layer's KQ matrix
(n_kv x n_ubatch x heads in f32), and a quantized V cache is refused. Defaults differ by server:

- upstream `llama-server`: n_ctx from the model (`-c 0`, b5000+), n_ubatch 512, flash attention
  `auto` (on where supported, b6200+), and since PR #16736 (Oct 2025) 4 slots sharing one
  unified KV buffer of n_ctx cells (`-np` auto); before, 1 slot;
- `python -m llama_cpp.server` (llama-cpp-python, `llama_cpp/server/settings.py`): n_ctx 2048,
  n_batch/n_ubatch 512, flash_attn False, one sequence, and n_gpu_layers 0 (nothing on the GPU
  unless the user asks; the plan assumes every layer offloaded and says so).

A context above the model's trained length is served with llama.cpp's warning
(`n_ctx_per_seq > n_ctx_train -- possible training context overflow`), so it is planned and
warned about. `--fit` keeps a 1024 MiB margin per device (docs/research/capacity-anchors.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vramlab.capacity import gguf_mix
from vramlab.capacity import kv as kvmod
from vramlab.capacity.engines import llamacpp_params_fit as params_fit
from vramlab.capacity.engines import llamacpp_placement as place
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.engines.llamacpp_graph import compute_buffer, graph_phases
from vramlab.capacity.estimate import EXACT, FORMULA, Component, Limits, band
from vramlab.capacity.kv import bytes_per_token_layer
from vramlab.capacity.spec import dtype_bytes
from vramlab.errors import ConfigError
from vramlab.units import gib

FIT_MARGIN = 1024 << 20
CTX_FROM_MODEL_FROM = (5000,)  # builds from b5000 take n_ctx from the model when -c is 0/absent
FLASH_ATTN_AUTO_FROM = (6200,)
UNIFIED_FOUR_SLOTS_FROM = (6850,)  # PR #16736: -np auto = 4 slots + unified KV (b7079 logs show n_slots = 4)
KV_PAD = 256
# llama-context.cpp since PR #17046 (Nov 2025; node-llama-cpp adapted to it on 2025-11-28, the exact
# build is not pinned): without a unified cache each of the n_seq_max streams gets
# pad256(pad256(n_ctx) / n_seq_max) cells, and n_ctx becomes that times n_seq_max.
PER_SEQ_PAD_FROM = (7000,)
QUANTIZED_CACHE_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


@dataclass(frozen=True)
class ServerSetup:
    """What the server resolves before it allocates anything."""

    server: str
    n_ctx: int  # total cells requested (-c), before padding
    slots: int  # -np
    unified: bool  # one KV buffer shared by every slot
    per_slot_context: int
    n_ubatch: int
    flash_attn: bool
    type_k: str
    type_v: str
    notes: tuple[str, ...]


def _params(ctx: Context) -> int:
    from vramlab.capacity.weights import breakdown

    return breakdown(ctx.model, ctx.tp, ctx.pp, 0).total_params


def resolve_server(ctx: Context) -> ServerSetup:
    settings, version = ctx.settings, ctx.version
    python_server = settings.llamacpp_server == "llama-cpp-python"
    notes: list[str] = []
    auto_slots = (
        not python_server and not settings.parallel and (not version or version >= UNIFIED_FOUR_SLOTS_FROM)
    )
    slots = 1 if python_server else settings.parallel or (4 if auto_slots else 1)
    unified = auto_slots
    n_ctx = settings.ctx_size or (
        settings.max_model_len * (1 if unified else slots) if settings.max_model_len else 0
    )
    if not n_ctx:
        if python_server:
            n_ctx = 2048
        else:
            n_ctx = ctx.model_max_len if (not version or version >= CTX_FROM_MODEL_FROM) else 4096
    if not n_ctx:
        raise ConfigError(f"the context length of {ctx.model.name} is unknown: pass --ctx-size")
    if n_ctx < slots and not unified:
        raise ConfigError(f"--parallel {slots} needs --ctx-size of at least {slots}")
    if python_server and settings.n_gpu_layers is None and not ctx.gpu.is_host:
        notes.append(
            "llama-cpp-python's server puts no layers on the GPU by default (n_gpu_layers=0): "
            "planned with every layer offloaded (--n_gpu_layers -1)"
        )
    if unified:
        notes.append("llama-server's default 4 slots share one unified KV buffer of n_ctx cells")
    flash = (
        settings.flash_attn
        if settings.flash_attn is not None
        else (not python_server and (not version or version >= FLASH_ATTN_AUTO_FROM))
    )
    type_k = settings.kv_cache_dtype if settings.kv_cache_dtype not in (None, "auto") else "f16"
    type_v = settings.cache_type_v or type_k
    if type_v in QUANTIZED_CACHE_TYPES and not flash:
        raise ConfigError(f"llama.cpp: quantized V cache ({type_v}) requires flash_attn (-fa on)")
    per_slot = n_ctx if unified else n_ctx // slots
    return ServerSetup(
        settings.llamacpp_server,
        n_ctx,
        slots,
        unified,
        per_slot,
        settings.n_ubatch or 512,
        flash,
        type_k,
        type_v,
        tuple(notes),
    )


def cell_bytes(ctx: Context, kind: str, type_k: str, type_v: str) -> float:
    """K + V bytes of one cell in one layer of *kind*, each in its own cache type."""
    m = ctx.model
    if type_k == type_v or m.is_mla:
        return bytes_per_token_layer(m, kind, type_k, "float16", 1)
    k_share = m.head_dim / (m.head_dim + m.value_head_dim)
    return bytes_per_token_layer(m, kind, type_k, "float16", 1) * k_share + bytes_per_token_layer(
        m, kind, type_v, "float16", 1
    ) * (1 - k_share)


def kv_cache_bytes(ctx: Context, server: ServerSetup, kv_size: int, layers: range | None = None) -> int:
    """The KV of *layers* (default: device 0's); each layer's KV lives with the layer."""
    m = ctx.model
    layers = ctx.layer_range(0) if layers is None else layers
    kinds = tuple(m.kinds[i] for i in layers)
    total: float = 0
    streams = 1 if server.unified else server.slots
    for kind in set(kinds):
        count = sum(1 for k in kinds if k == kind)
        cells = kv_size
        if kind == "sliding" and m.sliding_window:
            cells = min(kv_size, math.ceil((m.sliding_window * streams + server.n_ubatch) / KV_PAD) * KV_PAD)
        total += count * cell_bytes(ctx, kind, server.type_k, server.type_v) * cells
    state = kvmod.state_bytes_per_sequence(m, ctx.dtype, ctx.tp, layers) if len(layers) else 0
    return int(total + state * server.slots)


def weights_on_device(ctx: Context) -> Component:
    weights = ctx.weights_component()
    ftype = ctx.quant.gguf_type if ctx.quant is not None and ctx.quant.method == "gguf" else None
    if weights.provenance != EXACT and ftype and gguf_mix.supported(ctx.model, ftype):
        # The file type is a mix: llama-quantize's per-tensor rules give the CUDA model buffer.
        device = gguf_mix.device_bytes(ctx.model, ftype, ctx.layer_range(0), with_output=ctx.pp == 1)
        return band(
            "weights",
            device,
            0.005,
            0.005,
            FORMULA,
            f"{ftype.upper()} tensor by tensor (llama-quant.cpp's mix: Q6_K output, more bits for "
            "some attn_v/ffn_down layers); token embedding kept in host memory unless tied",
        )
    if ctx.model.tie_word_embeddings:
        return weights
    # The input embedding stays in host memory (the CPU_Mapped buffer): only a row lookup. A checkpoint quantized
    # apart from its embedding (gpt-oss's MXFP4 experts) keeps it at the unquantized width, not the average.
    q = ctx.quant
    per_param = (
        dtype_bytes(ctx.dtype)
        if q is not None and q.method != "gguf" and not q.quantize_embedding
        else weights.bytes / max(1, _params(ctx))
    )
    host = int(ctx.model.vocab_size * ctx.model.hidden_size * per_param)
    return band(
        "weights",
        weights.bytes - host,
        0.03,
        0.03,
        weights.provenance,
        weights.note + "; token embedding kept in host memory as llama.cpp does",
    )


def _pad(n: int) -> int:
    return math.ceil(n / KV_PAD) * KV_PAD


def kv_cells(ctx: Context, server: ServerSetup) -> int:
    """The KV cells llama.cpp allocates for n_ctx: padded to 256; without a unified cache (from
    PR #17046) every stream's share is padded to 256 too, so 1,000 cells over 3 slots are 3 x 512."""
    cells = _pad(server.n_ctx)
    if server.unified or server.slots <= 1 or (ctx.version and ctx.version < PER_SEQ_PAD_FROM):
        return cells
    return _pad(cells // server.slots) * server.slots


@dataclass
class Layout:
    devices: list[place.DeviceShare]
    host: place.DeviceShare
    device_bytes: list[int]  # each card's memory, before other processes
    per_tensor: bool
    notes: list[str]


def device_list(ctx: Context) -> list[tuple[str, int]]:
    s = ctx.settings
    if s.devices:
        return list(s.devices)
    return [(ctx.gpu.name, ctx.total)] * ctx.pp


def layout(ctx: Context, server: ServerSetup, kv_size: int) -> Layout:
    """Every buffer of every device and of the host, by llama.cpp's assignment rules."""
    s, m = ctx.settings, ctx.model
    cards = device_list(ctx)
    n_dev, n_layer = len(cards), m.num_layers
    mode = s.split_mode
    if mode not in ("layer", "row", "none"):
        raise ConfigError(f"--split-mode: expected layer, row or none, got {mode!r}")
    if s.main_gpu >= n_dev:
        raise ConfigError(f"--main-gpu {s.main_gpu}: only {n_dev} device(s) are planned")
    if s.tensor_split is not None and (len(s.tensor_split) > n_dev or any(x < 0 for x in s.tensor_split)):
        raise ConfigError(f"--tensor-split: at most {n_dev} proportions >= 0 for {n_dev} device(s)")
    free = [max(0, total - ctx.other) for _, total in cards]
    weights = (
        list(s.tensor_split) + [0.0] * (n_dev - len(s.tensor_split))
        if s.tensor_split
        else [float(f) for f in free]
    )
    points = place.split_points(weights)
    ngl = n_layer + 1 if s.n_gpu_layers is None or s.n_gpu_layers < 0 else s.n_gpu_layers
    where = place.layer_devices(n_layer, ngl, points, mode, s.main_gpu)
    overrides = place.parse_overrides(s.override_tensor, n_dev) + place.cpu_moe_overrides(
        min(s.n_cpu_moe, n_layer)
    )
    device_weights = weights_on_device(ctx).bytes
    ftype = ctx.quant.gguf_type if ctx.quant is not None and ctx.quant.method == "gguf" else None
    embedding = (
        gguf_mix.host_embedding_bytes(m, ftype)
        if ftype and gguf_mix.supported(m, ftype)
        else int(m.vocab_size * m.hidden_size * device_weights / max(1, _params(ctx)))
    )
    tensors, per_tensor = place.model_tensors(m, ftype, device_weights, embedding)
    modelled = sum(t.bytes for t in tensors[1:])
    if (
        modelled and modelled != device_weights
    ):  # the file's own total (GGUF header) wins; keep the proportions
        scale = device_weights / modelled
        tensors = tensors[:1] + [
            place.Tensor(t.name, t.layer, int(t.bytes * scale), t.matrix) for t in tensors[1:]
        ]
        last = tensors[-1]  # the rounding remainder goes to the output tensor: the sum stays the file's
        tensors[-1] = place.Tensor(
            last.name,
            last.layer,
            last.bytes + device_weights - sum(t.bytes for t in tensors[1:]),
            last.matrix,
        )
    shares = {d: place.DeviceShare(f"CUDA{d}") for d in range(n_dev)}
    shares[place.HOST] = place.DeviceShare("CPU")
    place.place_tensors(tensors, where, overrides, mode, points, shares, s.mmap)
    for il, d in enumerate(where[:n_layer]):
        shares[place.HOST if s.no_kv_offload else d].layers.append(il)
        if s.no_kv_offload and d != place.HOST:
            shares[d].layers.append(il)  # the layer's graph still runs on its device
    shares[where[n_layer]].has_output = True
    p = graph_phases(ctx, server, kv_size)
    experts_on_host = any(o.target == place.HOST for o in overrides)
    for d, share in shares.items():
        kv_layers = [
            il
            for il in share.layers
            if (s.no_kv_offload and d == place.HOST) or (not s.no_kv_offload and where[il] == d)
        ]
        share.kv_bytes = (
            kv_cache_bytes(ctx, server, kv_size, range(kv_layers[0], kv_layers[-1] + 1)) if kv_layers else 0
        )
        share.compute_bytes = place.compute_bytes(share, p, d == place.HOST, experts_on_host)
    notes = []
    offloaded = sum(1 for d in where if d != place.HOST)
    if offloaded < n_layer + 1:
        notes.append(
            f"offloaded {offloaded}/{n_layer + 1} layers to GPU (llama.cpp's count: the output layer is one); "
            "the rest run on the CPU"
        )
    if s.n_cpu_moe and not m.is_moe:
        notes.append(f"--n-cpu-moe {s.n_cpu_moe}: {m.name} has no MoE experts, nothing moves")
    if not per_tensor and (overrides or mode == "row"):
        notes.append(
            "tensor sizes are spread over each layer by parameter counts (the quantization mix is not "
            "modelled tensor by tensor): per-device model buffers are approximate"
        )
    return Layout(
        [shares[d] for d in range(n_dev)], shares[place.HOST], [t for _, t in cards], per_tensor, notes
    )


def device_report(
    lay: Layout, cards: list[tuple[str, int]], other: int, scratch: int, context: int
) -> list[dict[str, Any]]:
    """Each card's buffers as llama.cpp prints them, and what is left after them and the CUDA context."""
    out: list[dict[str, Any]] = []
    for (name, total), share in zip(cards, lay.devices, strict=True):
        compute = share.compute_bytes + (scratch if share.compute_bytes else 0)
        used = share.model_bytes + share.kv_bytes + compute
        out.append(
            {
                "device": share.name,
                "gpu": name,
                "memory_bytes": total,
                "free_bytes": max(0, total - other),
                "model_buffer_bytes": share.model_bytes,
                "kv_buffer_bytes": share.kv_bytes,
                "compute_buffer_bytes": compute,
                "layers": len(share.layers),
                "output_layer": share.has_output,
                "total_bytes": used,
                "headroom_bytes": total - other - used - context,
            }
        )
    return out


def _main_weights(ctx: Context, lay: Layout) -> Component:
    """Device 0's model buffer: the whole offloadable figure, or the tensors placed there."""
    weights, main = weights_on_device(ctx), lay.devices[0]
    if main.model_bytes == weights.bytes:
        return weights
    rel = 0.005 if lay.per_tensor else 0.05
    return band(
        "weights",
        main.model_bytes,
        rel,
        rel,
        weights.provenance,
        f"the tensors llama.cpp puts on {main.name} (of {gib(weights.bytes, unit=True)} offloadable)",
    )


def _host_report(lay: Layout, mmap: bool) -> dict[str, object]:
    host, on_devices = lay.host, {il for d in lay.devices for il in d.layers}
    return {
        "model_buffer_bytes": host.model_bytes,
        "mapped": mmap,
        "mapped_buffer_bytes": host.mapped_bytes,
        "kv_buffer_bytes": host.kv_bytes,
        "compute_buffer_bytes": host.compute_bytes,
        "layers": sum(1 for il in host.layers if il not in on_devices),
        "output_layer": host.has_output,
        "overridden_bytes": host.overridden_bytes,
    }


def _device_verdicts(
    report: list[dict[str, Any]], context: int, reasons: list[str], notes: list[str], margin_notes: bool
) -> None:
    """Every card must hold its buffers and the CUDA context; a card past the others' margin is noted."""
    for i, dev in enumerate(report):
        left = int(dev["headroom_bytes"])
        if left < 0:
            reasons.append(
                f"llama.cpp would allocate {gib(int(dev['total_bytes']) + context, unit=True)} on "
                f"{dev['device']} ({dev['gpu']}) with {gib(int(dev['free_bytes']), unit=True)} free "
                "(cudaMalloc failed: out of memory); lower --ctx-size or offload fewer layers (-ngl) "
                "or experts (--n-cpu-moe)"
            )
        elif i and left < FIT_MARGIN and margin_notes:
            notes.append(f"{dev['device']}: less than the 1024 MiB margin --fit keeps")


def plan(ctx: Context) -> PolicyResult:
    """llama-server's own --fit first (engines/llamacpp_fit.py), then the placement it loads with."""
    from vramlab.capacity.engines.llamacpp_fit import apply

    ctx, fitted, fit_notes = apply(ctx)
    result = _placed(ctx, margin_notes=fitted is None)
    result.notes[:0] = fit_notes
    if fitted is not None:
        result.extra["fit"] = fitted
    return result


def _placed(ctx: Context, margin_notes: bool) -> PolicyResult:
    server = resolve_server(ctx)
    kv_size = kv_cells(ctx, server)
    lay = layout(ctx, server, kv_size)
    cards = device_list(ctx)
    main = lay.devices[0]
    kv_bytes = main.kv_bytes
    comps: list[Component] = [
        ctx.constant_component(
            "cuda_context", "cuda_context_bytes", "CUDA context (not in llama.cpp's buffer lines)"
        ),
        _main_weights(ctx, lay),
        compute_buffer(ctx, server, main.compute_bytes),
    ]
    total, other = ctx.total, ctx.other

    def kv_rule(components: list[Component], point: str) -> int:
        return kv_bytes

    def limits(kv: int) -> Limits:
        return Limits(kv, server.n_ctx, server.n_ctx, float(server.slots))

    used = sum(cp.bytes for cp in comps) + kv_bytes
    reasons: list[str] = []
    notes = list(server.notes) + lay.notes
    trained = ctx.model_max_len
    if trained and server.per_slot_context > trained:
        notes.append(
            f"n_ctx_per_seq ({server.per_slot_context}) > n_ctx_train ({trained}) -- possible training "
            "context overflow: llama.cpp serves it with this warning; quality past the trained length "
            "is not guaranteed"
        )
    context = int(comps[0].bytes)
    report = device_report(lay, cards, other, int(ctx.constants["llamacpp_compute_scratch_bytes"]), context)
    _device_verdicts(report, context, reasons, notes, margin_notes)
    if not reasons and total - other - used < FIT_MARGIN and margin_notes:
        notes.append("less than the 1024 MiB margin --fit keeps: --fit would shrink the context")
    extra: dict[str, object] = {"devices": report, "host": _host_report(lay, ctx.settings.mmap)}
    return PolicyResult(
        components=comps,
        budget_bytes=total - other,
        kv_rule=kv_rule,
        limits=limits,
        max_model_len=server.per_slot_context,
        block_size=KV_PAD,
        kv_bytes_per_token=int(kv_bytes / kv_size) if kv_size else 0,
        settings=_resolved(ctx, server, kv_size, len(cards)),
        kv_provenance=FORMULA,
        kv_note=f"{kv_size} cells ({server.n_ctx} padded to {KV_PAD}) x layers x (K in {server.type_k} + V in "
        f"{server.type_v})",
        kv_fixed=True,
        per_sequence_state_bytes=ctx.state_bytes_per_seq(),
        reasons=reasons,
        notes=notes,
        extra=extra,
    )


def _resolved(ctx: Context, server: ServerSetup, kv_size: int, devices: int) -> dict[str, object]:
    return {
        "server": server.server,
        "ctx_size": server.n_ctx,
        "parallel": server.slots,
        "kv_unified": server.unified,
        "cache_type_k": server.type_k,
        "cache_type_v": server.type_v,
        "n_ubatch": server.n_ubatch,
        "flash_attn": server.flash_attn,
        "kv_size_padded": kv_size,
        "devices": devices,
        "n_gpu_layers": _ngl(ctx),
        "split_mode": ctx.settings.split_mode,
        "quantization": ctx.quant.gguf_type or ctx.quant.method if ctx.quant else None,
        "fit": params_fit.active(ctx),
    }


def _ngl(ctx: Context) -> int:
    n = ctx.settings.n_gpu_layers
    return ctx.model.num_layers + 1 if n is None or n < 0 else n
