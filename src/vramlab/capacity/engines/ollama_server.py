"""Ollama's releases that no longer estimate for themselves (read at the ollama/ollama tags).

- num_ctx when neither OLLAMA_CONTEXT_LENGTH nor the request sets it: 2048 before v0.6.8, 4096 since, and
  from v0.15.5 by the total VRAM of the GPUs (each card's total less OLLAMA_GPU_OVERHEAD, summed):
  262,144 from 47 GiB, 32,768 from 23 GiB, else 4,096 ("Use slightly lower thresholds (47/23 GiB vs.
  48/24 GiB)", server/routes.go `Serve`, commit 0334ffa62 "server: use tiered VRAM-based default context
  length"). It does not depend on OLLAMA_NUM_PARALLEL: the KV holds num_ctx x num_parallel. Capped at the
  trained context (llm/server.go).
- v0.12.11 (commit f560bd077, "Use Ollama engine memory layouts for both old and new engines") deleted
  llm/memory.go: from then the runner reports what it allocated and Ollama places layers from that,
  which is not modelled here; the estimator of v0.11.6 still plans those releases, with a note.
- v0.30.0 (commit 9db4bdbad, PR #16031, "use llama-server exclusively for GGML models"): Ollama starts
  upstream llama-server (the build in its LLAMA_CPP_VERSION file) with `-c num_ctx x num_parallel -np
  num_parallel`, `-ngl` only when num_gpu is set, `--flash-attn` from OLLAMA_FLASH_ATTENTION (else
  `auto`), `--cache-type-k/-v` from OLLAMA_KV_CACHE_TYPE, and `-b/-ub` from its automatic generation
  batch (llm/llama_server.go `startProcess`, server/sched.go `automaticGenerationBatch`); llama-server's
  own `--fit` (on by default) then places the layers. The plan is llama.cpp's at that build.
"""

from __future__ import annotations

from typing import Any

from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.units import GIB, gib

CONTEXT_4096_FROM = (0, 6, 8)  # envconfig: OLLAMA_CONTEXT_LENGTH's default 4096 (2048 before)
VRAM_TIERS_FROM = (0, 15, 5)
ESTIMATOR_LAST = (0, 12, 10)  # llm/memory.go was deleted in v0.12.11
LLAMA_SERVER_FROM = (0, 30, 0)
# LLAMA_CPP_VERSION at each release that changed it (ollama/ollama tags)
LLAMA_CPP_BUILDS = (
    ((0, 30, 0), "b9452"),
    ((0, 30, 5), "b9509"),
    ((0, 31, 0), "b9840"),
    ((0, 32, 0), "b9888"),
    ((0, 32, 15), "b10488"),
)
BATCH_DEFAULT, BATCH_MEDIUM, BATCH_LARGE = 512, 1024, 2048


def default_num_ctx(ctx: Context) -> tuple[int, str]:
    """num_ctx with nothing set, and the rule that gave it."""
    v = ctx.version
    if v and v < CONTEXT_4096_FROM:
        return 2048, "OLLAMA_CONTEXT_LENGTH unset: 2048 before v0.6.8"
    if v and v < VRAM_TIERS_FROM:
        return 4096, "OLLAMA_CONTEXT_LENGTH unset: 4096 (v0.6.8 to v0.15.4)"
    cards = list(ctx.settings.devices) or [(ctx.gpu.name, ctx.total)]
    vram = sum(total - ctx.settings.ollama_gpu_overhead_bytes for _, total in cards)
    tier = 262144 if vram >= 47 * GIB else 32768 if vram >= 23 * GIB else 4096
    return tier, (
        f"OLLAMA_CONTEXT_LENGTH unset: {tier:,} for {gib(vram, 1, unit=True)} of VRAM (v0.15.5+: 262,144 from 47 GiB, "
        "32,768 from 23 GiB, else 4,096)"
    )


def llama_cpp_build(version: tuple[int, ...]) -> str:
    return next(build for since, build in reversed(LLAMA_CPP_BUILDS) if version >= since)


def generation_batch(context_tokens: int, predicted: int, available: int, flash_attn: bool | None) -> int:
    """server/sched.go `automaticGenerationBatch` (v0.30.0): 2048 above a 32k context, 1024 above 4k, else
    512; lowered while the predicted VRAM (the file plus an f16 KV) passes 80 % of the free memory with the
    batch's surcharge (2 GiB / 768 MiB), or 60 % / 75 % for the larger batches. CUDA without flash
    attention keeps 512."""
    if flash_attn is False:
        return BATCH_DEFAULT
    batch = (
        BATCH_LARGE if context_tokens > 32768 else BATCH_MEDIUM if context_tokens > 4096 else BATCH_DEFAULT
    )

    def fits(b: int) -> bool:
        if not predicted or not available:
            return True
        threshold = available * 80 // 100
        share = 60 if b >= BATCH_LARGE else 75 if b >= BATCH_MEDIUM else 100
        surcharge = 2 * GIB if b >= BATCH_LARGE else 768 << 20 if b >= BATCH_MEDIUM else 0
        return (
            predicted <= threshold
            and surcharge <= threshold - predicted
            and predicted <= available * share // 100
        )

    while batch > BATCH_DEFAULT and not fits(batch):
        batch = BATCH_MEDIUM if batch > BATCH_MEDIUM else BATCH_DEFAULT
    return batch


def plan(ctx: Context, num_ctx: int, parallel: int, notes: list[str]) -> PolicyResult:
    """Ollama 0.30+: llama-server at its build, with the flags Ollama passes; --fit places the layers."""
    from vramlab.capacity.engines import llamacpp
    from vramlab.capacity.weights import weight_bytes

    s, m = ctx.settings, ctx.model
    build = llama_cpp_build(ctx.version)
    kv_type = s.kv_cache_dtype if s.kv_cache_dtype in ("q8_0", "q4_0", "f16") else None
    heads = max(1, m.num_attention_heads)
    # llm/llama_server.go PredictServerVRAM: the file's size plus 2 x layers x kv heads x (hidden / heads)
    # x context x 2 bytes
    file_bytes, _ = weight_bytes(m, ctx.dtype, s.quantization, 1, 1, 0)
    predicted = (
        file_bytes
        + 2 * m.num_layers * max(1, m.num_kv_heads) * (m.hidden_size // heads) * num_ctx * parallel * 2
    )
    cards = list(s.devices) or [(ctx.gpu.name, ctx.total)]
    batch = generation_batch(
        num_ctx * parallel, predicted, sum(t - ctx.other for _, t in cards), s.flash_attn
    )
    inner = s.with_(
        engine="llama.cpp",
        engine_version=build,
        ctx_size=num_ctx * parallel,
        max_model_len=None,
        parallel=parallel,
        n_gpu_layers=s.n_gpu_layers if s.n_gpu_layers is not None and s.n_gpu_layers >= 0 else None,
        kv_cache_dtype=kv_type or "auto",
        n_ubatch=batch,
        llamacpp_server="llama-server",
    )
    r = llamacpp.plan(Context(m, ctx.gpu, inner, ctx.constants))
    r.notes[:0] = notes + [
        f"Ollama {s.resolved_version} runs llama-server {build}: -c {num_ctx * parallel} -np {parallel} "
        f"-b {batch} -ub {batch} (its automatic generation batch), layers placed by llama-server's --fit"
    ]
    settings: dict[str, Any] = dict(r.settings)
    settings.update(num_ctx=num_ctx, num_parallel=parallel, num_batch=batch, llama_cpp_build=build)
    r.settings = settings
    r.max_model_len = num_ctx
    return r
