"""Ollama's `GraphSize` (fs/ggml/ggml.go at v0.11.6): KV per layer and the partial / full compute graph per
architecture, and the vision projector's share; the offload decision that uses them is ollama.py."""

from __future__ import annotations

from vramlab.capacity.engines.common import Context

BATCH = 512  # api.Options NumBatch


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
    else:
        partial = heads // max(1, m.num_kv_heads) * sum(kv) // 6
        full = partial
    return kv, partial, full


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
