"""llama.cpp's memory: every slot's KV allocated up front, plus model and compute buffers.

KV = padded n_ctx x layers x (K + V) x type bytes (f16 by default; q8_0 / q4_0 with
--cache-type-k/v); sliding-window layers of iSWA models hold only the window plus a ubatch.
n_ctx (-c) is shared by the --parallel slots, each getting n_ctx / parallel. `--fit` keeps a
1024 MiB margin per device (research/capacity-anchors.md §3).
"""

from __future__ import annotations

import math

from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import FORMULA, GIB, Component, Limits, band
from vramlab.capacity.kv import bytes_per_token_layer
from vramlab.errors import ConfigError

FIT_MARGIN = 1024 << 20


def _params(ctx: Context) -> int:
    from vramlab.capacity.weights import breakdown

    return breakdown(ctx.model, ctx.tp, ctx.pp, 0).total_params
CTX_FROM_MODEL_FROM = (5000,)  # builds from b5000 take n_ctx from the model when -c is 0/absent
FLASH_ATTN_AUTO_FROM = (6200,)
KV_PAD = 256


def plan(ctx: Context) -> PolicyResult:
    m, s, c = ctx.model, ctx.settings, ctx.constants
    v = ctx.version
    parallel = s.parallel or 1
    n_ctx = s.ctx_size or (s.max_model_len * parallel if s.max_model_len else 0)
    if not n_ctx:
        n_ctx = ctx.model_max_len if (not v or v >= CTX_FROM_MODEL_FROM) else 4096
    if not n_ctx:
        raise ConfigError(f"the context length of {m.name} is unknown: pass --ctx-size")
    if parallel < 1 or n_ctx < parallel:
        raise ConfigError(f"--parallel {parallel} needs --ctx-size of at least {parallel}")
    if ctx.model_max_len and n_ctx // parallel > ctx.model_max_len:
        raise ConfigError(f"llama.cpp: per-slot context {n_ctx // parallel} exceeds the model's trained "
                          f"context {ctx.model_max_len}")
    kv_type = s.kv_cache_dtype if s.kv_cache_dtype not in (None, "auto") else "f16"
    ubatch = s.n_ubatch or 512
    flash = s.flash_attn if s.flash_attn is not None else (not v or v >= FLASH_ATTN_AUTO_FROM)
    kv_size = math.ceil(n_ctx / KV_PAD) * KV_PAD
    # Several devices split the layers (--split-mode layer); this is device 0's share.
    kinds = tuple(m.kinds[i] for i in ctx.layer_range(0))
    kv_bytes: float = 0
    for kind in set(kinds):
        n = sum(1 for k in kinds if k == kind)
        per = bytes_per_token_layer(m, kind, kv_type, "float16", 1)
        cells = kv_size
        if kind == "sliding" and m.sliding_window:
            cells = min(kv_size, math.ceil((m.sliding_window * parallel + ubatch) / KV_PAD) * KV_PAD)
        kv_bytes += n * per * cells
    kv_bytes += ctx.state_bytes_per_seq(0) * parallel
    kv_bytes = int(kv_bytes)
    weights = ctx.weights_component()
    if not m.tie_word_embeddings:
        # The input embedding stays in host memory (the CPU_Mapped buffer): only a row lookup.
        per_param = weights.bytes / max(1, _params(ctx))
        host = int(m.vocab_size * m.hidden_size * per_param)
        weights = band("weights", weights.bytes - host, 0.03, 0.03, weights.provenance,
                       weights.note + "; token embedding kept in host memory as llama.cpp does")
    comps: list[Component] = [
        ctx.constant_component("cuda_context", "cuda_context_bytes", "CUDA context (not in llama.cpp's buffer lines)"),
        weights,
    ]
    compute = 4 * ubatch * (m.vocab_size + 4 * m.hidden_size) + c["llamacpp_compute_scratch_bytes"]
    if not flash:  # the KQ matrix of one layer: n_kv x n_ubatch x heads in f32
        compute += 4 * kv_size * ubatch * m.num_attention_heads
    comps.append(band("activation_peak", compute, c.band("llamacpp_compute_scratch_bytes"),
                      c.band("llamacpp_compute_scratch_bytes"), c.provenance("llamacpp_compute_scratch_bytes"),
                      f"compute buffer for n_ubatch {ubatch}" + ("" if flash else " without flash attention (KQ matrix)")))
    total, other = ctx.total, ctx.other
    per_slot = n_ctx // parallel

    def kv_rule(components: list[Component], point: str) -> int:
        return kv_bytes

    def limits(kv: int) -> Limits:
        return Limits(kv, n_ctx, n_ctx, float(parallel))

    used = sum(cp.bytes for cp in comps) + kv_bytes
    reasons, notes = [], []
    if used > total - other:
        reasons.append(f"llama.cpp would allocate {used / GIB:.2f} GiB on a card with {(total - other) / GIB:.2f} GiB "
                       "free (cudaMalloc failed: out of memory); lower --ctx-size or offload fewer layers")
    elif total - other - used < FIT_MARGIN:
        notes.append("less than the 1024 MiB margin --fit keeps: --fit would shrink the context")
    return PolicyResult(
        components=comps, budget_bytes=total - other, kv_rule=kv_rule, limits=limits, max_model_len=per_slot,
        block_size=KV_PAD, kv_bytes_per_token=int(kv_bytes / kv_size) if kv_size else 0,
        settings={"ctx_size": n_ctx, "parallel": parallel, "cache_type": kv_type, "n_ubatch": ubatch,
                  "flash_attn": flash, "kv_size_padded": kv_size, "devices": ctx.pp,
                  "quantization": ctx.quant.gguf_type or ctx.quant.method if ctx.quant else None},
        kv_provenance=FORMULA, kv_note=f"{kv_size} cells ({n_ctx} padded to {KV_PAD}) x layers x K+V in {kv_type}",
        kv_fixed=True, per_sequence_state_bytes=ctx.state_bytes_per_seq(), reasons=reasons, notes=notes,
    )
