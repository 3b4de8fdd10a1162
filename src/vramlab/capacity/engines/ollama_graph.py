"""Ollama's `GraphSize` (fs/ggml/ggml.go at v0.11.6; gpt-oss's case as it changed up to v0.12.10): KV per layer and
the partial / full compute graph per architecture, whether flash attention is on, and the vision projector's share;
the offload decision that uses them is ollama.py."""

from __future__ import annotations

from vramlab.capacity.engines.common import Context

BATCH = 512  # api.Options NumBatch
MIB = 1 << 20
# fs/ggml/ggml.go `case "gptoss"`: v0.11.0-v0.11.4 set fullOffload = 4 x GQA x kvTotal / 6 and partialOffload twice
# that; v0.11.5 on set only partialOffload = 2 x GQA x kvTotal / 6 (llm/memory.go then takes the full graph equal to
# it); v0.11.8 on, with flash attention, `(4 x numParallel + context >> 10 + 110) MiB` ("rough estimate of graph size
# with flash attention on"), and `GGML.FlashAttention()` turns flash attention on for gpt-oss ("model wants flash
# attention"): OLLAMA_FLASH_ATTENTION OR the model until v0.12.4, the variable over the model's default from v0.12.5
# (`envconfig.FlashAttention(f.FlashAttention())`).
GPTOSS_PARTIAL_ONLY_FROM = (0, 11, 5)
GPTOSS_FLASH_FROM = (0, 11, 8)
FLASH_ENV_OVERRIDES_FROM = (0, 12, 5)
GPTOSS = ("gpt_oss", "gptoss")


def flash_attention(ctx: Context) -> tuple[bool, list[str]]:
    """Whether `estimateGPULayers` sizes with flash attention: asked for (OLLAMA_FLASH_ATTENTION, `--flash-attn`) or
    wanted by the model, and supported (not Pascal; K and V heads of one width; not MLA)."""
    m, asked, version = ctx.model, ctx.settings.flash_attn, ctx.version
    wants = m.model_type in GPTOSS and (not version or version >= GPTOSS_FLASH_FROM)
    if not version or version >= FLASH_ENV_OVERRIDES_FROM:
        on = wants if asked is None else asked
    else:
        on = bool(asked) or wants
    supported = ctx.gpu.arch not in ("pascal",) and m.head_dim == m.value_head_dim and not m.is_mla
    notes = []
    if on and not supported:
        notes.append("flash attention enabled but not supported by model (or card): KV stays f16")
    elif wants and on and not asked:
        notes.append("model wants flash attention (gpt-oss, Ollama v0.11.8 on)")
    return on and supported, notes


def graph_sizes(ctx: Context, num_ctx: int, parallel: int, kv_bytes: float) -> tuple[list[int], int, int]:
    """`GraphSize`: KV per layer and the partial / full graph."""
    m = ctx.model
    context, batch = num_ctx * parallel, min(num_ctx, BATCH)
    emb, heads, kvh, vocab = m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.vocab_size
    hk = m.head_dim if not m.is_mla else (m.qk_nope_head_dim or 0) + (m.qk_rope_head_dim or 0)
    hv = m.value_head_dim if not m.is_mla else (m.mla_v_head_dim or m.head_dim)
    if m.is_mla:
        kvh = heads  # GGUF deepseek2 stores per-head K/V sizes; llama.cpp's early cache kept every head
    kv = [int(context * (hk + hv) * kvh * kv_bytes)] * m.num_layers
    arch = m.model_type
    if arch.startswith(("gemma2", "gemma3", "gemma")):
        full = max(
            4 * batch * (emb + vocab), 4 * batch * (2 + context + context * heads + 2 * emb + 2 * hk * heads)
        )
        partial = max(
            4 * emb * batch + emb * vocab * 105 // 128 + 4 * vocab * batch,
            4 * batch * (2 * emb + 1 + 2 * hk * heads + context + context * heads)
            + 4 * hk * context * 8
            + emb * hk * heads * 9 // 16,
        )
        if arch.startswith("gemma3") and m.sliding_window:
            window = parallel * m.sliding_window + batch
            kv = [
                k if (i + 1) % 6 == 0 else int(window * (hk + hv) * kvh * kv_bytes) for i, k in enumerate(kv)
            ]
    elif arch in ("llama", "mistral") and not m.is_moe:
        full = max(4 * batch * (1 + 4 * emb + context * (1 + heads)), 4 * batch * (emb + vocab))
        partial = 4 * batch * emb + max(
            4 * batch * (1 + emb + max(context, emb))
            + emb * emb * 9 // 16
            + 4 * context * (batch * heads + hk * kvh),
            4 * batch * (emb + vocab) + emb * vocab * 105 // 128,
        )
    elif arch == "qwen2":
        full = max(4 * batch * (emb + vocab), 4 * batch * (1 + 2 * emb + context + context * heads))
        partial = max(
            4 * batch * (emb + vocab) + emb * vocab * 105 // 128,
            4 * (batch * (1 + 2 * emb + context * (1 + heads)) + emb * (1 + context)),
        )
    elif m.is_mla:  # deepseek2
        full = max(
            4 * batch * (3 * emb + vocab), 4 * batch * (3 * emb + 2 + context * (1 + kvh) + 2 * hk * kvh)
        )
        partial = max(
            4 * batch * (3 * emb + vocab) + emb * vocab * 105 // 128,
            4 * batch * (2 * emb + 1 + 2 * hk * kvh + context + context * kvh)
            + 4 * hk * context * kvh
            + emb * hk * kvh * 9 // 16,
        )
    elif arch in GPTOSS:
        kv, partial, full = _gptoss(ctx, kv, parallel, batch, context, int((hk + hv) * kvh * kv_bytes))
    else:
        partial = heads // max(1, m.num_kv_heads) * sum(kv) // 6
        full = partial
    return kv, partial, full


def _gptoss(
    ctx: Context, kv: list[int], parallel: int, batch: int, context: int, per_cell: int
) -> tuple[list[int], int, int]:
    """`case "gptoss"`: the even (sliding) layers hold `num_parallel x 4096 + batch` cells; the graph by release
    (GPTOSS_PARTIAL_ONLY_FROM, GPTOSS_FLASH_FROM). GQA x kvTotal / 6 in Go's left-to-right integer order."""
    m, version = ctx.model, ctx.version
    kv_total = sum(kv)  # before the sliding layers shrink: Go sums kvTotal first
    kv = [per_cell * (parallel * 4096 + batch) if i % 2 == 0 else k for i, k in enumerate(kv)]
    heads, kv_min = m.num_attention_heads, max(1, m.num_kv_heads)
    if version and version < GPTOSS_PARTIAL_ONLY_FROM:
        full = 4 * heads // kv_min * kv_total // 6
        return kv, 2 * full, full
    partial = 2 * heads // kv_min * kv_total // 6
    if flash_attention(ctx)[0] and (not version or version >= GPTOSS_FLASH_FROM):
        partial = (4 * parallel + (context >> 10) + 110) * MIB
    return kv, partial, partial


# Gemma 3's SigLIP tower (its config's vision_config: image_size 896, patch_size 14, 3 channels, 16 heads,
# hidden_size 1152), the shapes `VisionGraphSize` reads from the GGUF's vision.* keys.
GEMMA3_VISION = (896, 14, 3, 16, 1152)


def projector(ctx: Context) -> tuple[int, int]:
    """`VisionGraphSize` (Ollama engine): the vision tower's weights (F16) and its graph; gemma3 only."""
    m = ctx.model
    if not m.vision_params or not m.model_type.startswith("gemma3"):
        return 0, 0
    image, patch, channels, heads, width = GEMMA3_VISION
    patches = (image // patch) ** 2
    return 2 * m.vision_params, 4 * (image * image * channels + width * patch + patches * patches * heads)
