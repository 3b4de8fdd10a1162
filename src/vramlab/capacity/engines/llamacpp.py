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

from vramlab.capacity import gguf_mix
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import EXACT, FORMULA, GIB, Component, Limits, band
from vramlab.capacity.kv import bytes_per_token_layer
from vramlab.errors import ConfigError

FIT_MARGIN = 1024 << 20
CTX_FROM_MODEL_FROM = (5000,)  # builds from b5000 take n_ctx from the model when -c is 0/absent
FLASH_ATTN_AUTO_FROM = (6200,)
UNIFIED_FOUR_SLOTS_FROM = (6850,)  # PR #16736: -np auto = 4 slots + unified KV (b7079 logs show n_slots = 4)
KV_PAD = 256
# llama-context.cpp since PR #17046 (Nov 2025; node-llama-cpp adapted to it on 2025-11-28, the exact
# build is not pinned): without a unified cache each of the n_seq_max streams gets
# pad256(pad256(n_ctx) / n_seq_max) cells, and n_ctx becomes that times n_seq_max.
PER_SEQ_PAD_FROM = (7000,)
# PR #23861 (merged 2026-05-29; issue #23527 reported on b9272 a week before): llama-server reserves logits
# for n_seqs rows instead of n_ubatch. The first build is not pinned: b9300 is taken.
LOGITS_PER_SEQ_FROM = (9300,)
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
    auto_slots = not python_server and not settings.parallel and (not version or version >= UNIFIED_FOUR_SLOTS_FROM)
    slots = 1 if python_server else settings.parallel or (4 if auto_slots else 1)
    unified = auto_slots
    n_ctx = settings.ctx_size or (settings.max_model_len * (1 if unified else slots) if settings.max_model_len else 0)
    if not n_ctx:
        if python_server:
            n_ctx = 2048
        else:
            n_ctx = ctx.model_max_len if (not version or version >= CTX_FROM_MODEL_FROM) else 4096
    if not n_ctx:
        raise ConfigError(f"the context length of {ctx.model.name} is unknown: pass --ctx-size")
    if n_ctx < slots and not unified:
        raise ConfigError(f"--parallel {slots} needs --ctx-size of at least {slots}")
    if python_server:
        notes.append("llama-cpp-python's server puts no layers on the GPU by default (n_gpu_layers=0): "
                     "planned with every layer offloaded (--n_gpu_layers -1)")
    if unified:
        notes.append("llama-server's default 4 slots share one unified KV buffer of n_ctx cells")
    flash = settings.flash_attn if settings.flash_attn is not None else \
        (not python_server and (not version or version >= FLASH_ATTN_AUTO_FROM))
    type_k = settings.kv_cache_dtype if settings.kv_cache_dtype not in (None, "auto") else "f16"
    type_v = settings.cache_type_v or type_k
    if type_v in QUANTIZED_CACHE_TYPES and not flash:
        raise ConfigError(f"llama.cpp: quantized V cache ({type_v}) requires flash_attn (-fa on)")
    per_slot = n_ctx if unified else n_ctx // slots
    return ServerSetup(settings.llamacpp_server, n_ctx, slots, unified, per_slot, settings.n_ubatch or 512, flash,
                       type_k, type_v, tuple(notes))


def cell_bytes(ctx: Context, kind: str, type_k: str, type_v: str) -> float:
    """K + V bytes of one cell in one layer of *kind*, each in its own cache type."""
    m = ctx.model
    if type_k == type_v or m.is_mla:
        return bytes_per_token_layer(m, kind, type_k, "float16", 1)
    k_share = m.head_dim / (m.head_dim + m.value_head_dim)
    return (bytes_per_token_layer(m, kind, type_k, "float16", 1) * k_share
            + bytes_per_token_layer(m, kind, type_v, "float16", 1) * (1 - k_share))


def kv_cache_bytes(ctx: Context, server: ServerSetup, kv_size: int) -> int:
    """Device 0's share of the KV (--split-mode layer splits layers over devices)."""
    m = ctx.model
    kinds = tuple(m.kinds[i] for i in ctx.layer_range(0))
    total: float = 0
    streams = 1 if server.unified else server.slots
    for kind in set(kinds):
        layers = sum(1 for k in kinds if k == kind)
        cells = kv_size
        if kind == "sliding" and m.sliding_window:
            cells = min(kv_size, math.ceil((m.sliding_window * streams + server.n_ubatch) / KV_PAD) * KV_PAD)
        total += layers * cell_bytes(ctx, kind, server.type_k, server.type_v) * cells
    return int(total + ctx.state_bytes_per_seq(0) * server.slots)


def weights_on_device(ctx: Context) -> Component:
    weights = ctx.weights_component()
    ftype = ctx.quant.gguf_type if ctx.quant is not None and ctx.quant.method == "gguf" else None
    if weights.provenance != EXACT and ftype and gguf_mix.supported(ctx.model, ftype):
        # The file type is a mix: llama-quantize's per-tensor rules give the CUDA model buffer.
        device = gguf_mix.device_bytes(ctx.model, ftype, ctx.layer_range(0), with_output=ctx.pp == 1)
        return band("weights", device, 0.005, 0.005, FORMULA,
                    f"{ftype.upper()} tensor by tensor (llama-quant.cpp's mix: Q6_K output, more bits for "
                    "some attn_v/ffn_down layers); token embedding kept in host memory unless tied")
    if ctx.model.tie_word_embeddings:
        return weights
    # The input embedding stays in host memory (the CPU_Mapped buffer): only a row lookup.
    per_param = weights.bytes / max(1, _params(ctx))
    host = int(ctx.model.vocab_size * ctx.model.hidden_size * per_param)
    return band("weights", weights.bytes - host, 0.03, 0.03, weights.provenance,
                weights.note + "; token embedding kept in host memory as llama.cpp does")


def reserved_outputs(ctx: Context, server: ServerSetup) -> int:
    """Logit rows the worst-case graph reserves: every token of a ubatch (`graph_reserve(n_tokens, n_seqs,
    n_tokens)`), except in llama-server from PR #23861 (merged 2026-05-29, "only reserves logits space for
    n_seqs when possible"), where it is one per sequence (n_seqs = 1 with a unified cache)."""
    if server.server == "llama-server" and (not ctx.version or ctx.version >= LOGITS_PER_SEQ_FROM):
        return 1 if server.unified else server.slots
    return server.n_ubatch


def compute_buffer(ctx: Context, server: ServerSetup, kv_size: int) -> Component:
    m, constants = ctx.model, ctx.constants
    outputs = reserved_outputs(ctx, server)
    compute = 4 * (outputs * m.vocab_size + server.n_ubatch * 4 * m.hidden_size) \
        + constants["llamacpp_compute_scratch_bytes"]
    if not server.flash_attn:  # the KQ matrix of one layer: n_kv x n_ubatch x heads in f32
        compute += 4 * kv_size * server.n_ubatch * m.num_attention_heads
    key = "llamacpp_compute_scratch_bytes"
    # The scratch beyond the logits was read off builds whose buffer the logits dominated: with one logit
    # row per sequence it is the whole figure (a 2026 Qwen3-4B log: 85 MiB) -> unknown term, band widened.
    high = constants.band(key) + (2.0 if outputs < server.n_ubatch else 0.0)
    return band("activation_peak", compute, constants.band(key), high, constants.provenance(key),
                f"compute buffer for n_ubatch {server.n_ubatch}, logits for {outputs} output rows"
                + ("" if server.flash_attn else " without flash attention (KQ matrix of n_ctx x n_ubatch x heads)")
                + ("; unknown term, band widened: the graph scratch without n_ubatch logits is not measured"
                   if outputs < server.n_ubatch else ""))


def _pad(n: int) -> int:
    return math.ceil(n / KV_PAD) * KV_PAD


def kv_cells(ctx: Context, server: ServerSetup) -> int:
    """The KV cells llama.cpp allocates for n_ctx: padded to 256; without a unified cache (from
    PR #17046) every stream's share is padded to 256 too, so 1,000 cells over 3 slots are 3 x 512."""
    cells = _pad(server.n_ctx)
    if server.unified or server.slots <= 1 or (ctx.version and ctx.version < PER_SEQ_PAD_FROM):
        return cells
    return _pad(cells // server.slots) * server.slots


def plan(ctx: Context) -> PolicyResult:
    server = resolve_server(ctx)
    kv_size = kv_cells(ctx, server)
    kv_bytes = kv_cache_bytes(ctx, server, kv_size)
    comps: list[Component] = [
        ctx.constant_component("cuda_context", "cuda_context_bytes", "CUDA context (not in llama.cpp's buffer lines)"),
        weights_on_device(ctx),
        compute_buffer(ctx, server, kv_size),
    ]
    total, other = ctx.total, ctx.other

    def kv_rule(components: list[Component], point: str) -> int:
        return kv_bytes

    def limits(kv: int) -> Limits:
        return Limits(kv, server.n_ctx, server.n_ctx, float(server.slots))

    used = sum(cp.bytes for cp in comps) + kv_bytes
    reasons: list[str] = []
    notes = list(server.notes)
    trained = ctx.model_max_len
    if trained and server.per_slot_context > trained:
        notes.append(f"n_ctx_per_seq ({server.per_slot_context}) > n_ctx_train ({trained}) -- possible training "
                     "context overflow: llama.cpp serves it with this warning; quality past the trained length "
                     "is not guaranteed")
    if used > total - other:
        reasons.append(f"llama.cpp would allocate {used / GIB:.2f} GiB on a card with {(total - other) / GIB:.2f} GiB "
                       "free (cudaMalloc failed: out of memory); lower --ctx-size or offload fewer layers")
    elif total - other - used < FIT_MARGIN:
        notes.append("less than the 1024 MiB margin --fit keeps: --fit would shrink the context")
    return PolicyResult(
        components=comps, budget_bytes=total - other, kv_rule=kv_rule, limits=limits,
        max_model_len=server.per_slot_context, block_size=KV_PAD,
        kv_bytes_per_token=int(kv_bytes / kv_size) if kv_size else 0,
        settings={"server": server.server, "ctx_size": server.n_ctx, "parallel": server.slots,
                  "kv_unified": server.unified, "cache_type_k": server.type_k, "cache_type_v": server.type_v,
                  "n_ubatch": server.n_ubatch, "flash_attn": server.flash_attn, "kv_size_padded": kv_size,
                  "devices": ctx.pp,
                  "quantization": ctx.quant.gguf_type or ctx.quant.method if ctx.quant else None},
        kv_provenance=FORMULA,
        kv_note=f"{kv_size} cells ({server.n_ctx} padded to {KV_PAD}) x layers x (K in {server.type_k} + V in "
                f"{server.type_v})",
        kv_fixed=True, per_sequence_state_bytes=ctx.state_bytes_per_seq(), reasons=reasons, notes=notes,
    )
