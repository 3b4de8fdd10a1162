"""Text-generation-inference's memory policy (docs/research/capacity-anchors.md §4).

Warm-up runs the largest prefill batch (`--max-batch-prefill-tokens`), then sizes the KV pool from
what is free after that peak (`mem_get_info` with no `empty_cache` in between, so the peak stays
reserved), less `(1 - MEMORY_FRACTION) x total` (utils/import_utils.py `get_cuda_free_memory`), and
adds back the warm-up batch's own blocks. What it keeps back, by release (server/.../flash_causal_lm.py
`warmup` and models/globals.py `TGI_WIGGLE_ROOM`, read at every tag):

- 1.0.0-1.4.0: nothing (`int(free_memory // total_cache_size) + cache_manager.num_blocks`);
- 1.4.1-2.2.x: 5 % of the free memory (`int((free_memory * 0.95) // total_cache_size)`);
- 2.3.x: the same through `TGI_WIGGLE_ROOM` = 0.95; 2.4.x: `TGI_WIGGLE_ROOM` = 0.90 (10 % of free);
- 3.0.x: `get_free_memory(device, MEMORY_FRACTION * TGI_WIGGLE_ROOM)` with 0.95: 5 % of the card;
  3.1-3.2: 0.93 (7 %); 3.3 onwards: 0.90 (10 %).

From 2.3.0 the launcher defaults to `ATTENTION=flashinfer` with prefix caching: blocks of 1 token
(`BLOCK_SIZE = 1`); before, paged attention in blocks of 16. The router's warm-up requests ask for
prefill logprobs (`prefill_logprobs: true` in its client `warmup`, 1.x to 3.x), so the warm-up forward
holds the logits of every prefill token and their `log_softmax` (generate_token): 2 x tokens x vocab
at the model dtype. CUDA graphs are captured afterwards, inside what was kept back.
Gemma's tied LM head is a second copy of the embedding (GEMMA_TYPES), and at 2.4 with shards the warm-up
holds the shard's logits beside the gathered ones (warmup_logits_component).
"""

from __future__ import annotations

from vramlab.capacity.defaults import TGI_UNCAPPED_FROM as FRACTION_WIGGLE_FROM
from vramlab.capacity.defaults import tgi_prefill_tokens as default_prefill_tokens
from vramlab.capacity.defaults import tgi_warmup_total, tgi_window_refusal
from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.estimate import ENGINE, FORMULA, Component, Limits, band
from vramlab.capacity.overheads import forward_peak_bytes, moe_workspace_bytes
from vramlab.capacity.spec import dtype_bytes
from vramlab.errors import ConfigError
from vramlab.units import gib

# (first release, share of the FREE memory kept for KV) before 3.0; (first release, TGI_WIGGLE_ROOM) from 3.0.
FREE_SHARE = (((1, 0), 1.0), ((1, 4, 1), 0.95), ((2, 4), 0.90))
CARD_WIGGLE = (((3, 0), 0.95), ((3, 1), 0.93), ((3, 3), 0.90))
UNKNOWN_TERM_BAND = 0.5  # the band added to a term that is not modelled (as vLLM's, engines/vllm_eras.py)
LEGACY_BAND = (
    1.0  # TGI 2.2 on an A10G left ~2 GiB less than this rule after warm-up: unknown term, band widened
)
FLASHINFER_FROM = (2, 3)  # the launcher's default ATTENTION=flashinfer (BLOCK_SIZE 1) from 2.3.0
LOGSOFTMAX_IN_PLACE_FROM = (2, 4)  # generate_token: torch.log_softmax(out, -1, out=out)
NO_PREFILL_LOGPROBS_FROM = (3, 0)  # from_pb: `if not REQUEST_LOGPROBS: r.prefill_logprobs = False`
# Gemma's modelling files (flash_gemma_modeling.py from 1.4.2, flash_gemma2_/flash_gemma3_modeling.py) load the tied
# LM head from `embed_tokens` through `Weights.get_tensor` / `get_sharded`, a second device copy: the embedding is then
# scaled in place (`self.embed_tokens.weight *= embed_norm`, v1.4.3 and v3.3.0), which only works on a separate tensor.
GEMMA_TYPES = ("gemma", "gemma2", "gemma3", "gemma3_text")


def _by_release(table: tuple[tuple[tuple[int, ...], float], ...], version: tuple[int, ...]) -> float:
    value = table[0][1]
    for first, share in table:
        if version >= first:
            value = share
    return value


def card_wiggle(version: tuple[int, ...] | None) -> float:
    """TGI_WIGGLE_ROOM of a 3.x release (the newest when the version is not known)."""
    return _by_release(CARD_WIGGLE, version) if version else CARD_WIGGLE[-1][1]


def warmup_logits_component(
    ctx: Context, prefill_tokens: int, extra_band: float = 0.0, requests: int = 1
) -> Component:
    """The warm-up's logits. The router warms up with prefill logprobs; to 2.3 the server keeps the logits of
    every prefill token and their log_softmax (two copies), 2.4 takes log_softmax in place (one copy), and
    from 3.0 `from_pb` drops prefill logprobs unless REQUEST_LOGPROBS is set (default "0"): only the
    next-token rows remain."""
    vocab_row = ctx.model.vocab_size * dtype_bytes(ctx.dtype)
    version = ctx.version
    if version and version < LOGSOFTMAX_IN_PLACE_FROM:
        rows, note = 2.0 * prefill_tokens, "logits + log_softmax of every prefill token (prefill logprobs)"
    elif version and version < NO_PREFILL_LOGPROBS_FROM:
        rows, note = (
            1.0 * prefill_tokens,
            "logits of every prefill token, log_softmax in place (prefill logprobs)",
        )
        shard_rows, gathered = lm_head_shard_rows(ctx)
        if gathered:  # TensorParallelHead.forward (v2.4.0): the shard's logits and world_out are both held
            rows += (
                prefill_tokens * shard_rows / ctx.model.vocab_size
            )  # while all_gather_into_tensor fills world_out
            note += f"; the shard's own {shard_rows}-row logits held beside the gathered ones"
    else:
        rows, note = float(requests), "next-token logits only (prefill logprobs off: REQUEST_LOGPROBS unset)"
    return band("warmup_logits", rows * vocab_row, 0.1, 0.1 + extra_band, FORMULA, note)


def lm_head_shard_rows(ctx: Context) -> tuple[int, bool]:
    """(vocabulary rows of the LM head on one shard, whether its logits are all-gathered). TensorParallelHead.load
    (utils/layers.py v1.4.3, layers/tensor_parallel.py v2.4.0) shards it by rows when the vocabulary divides by
    the shard count, else loads it whole and does not gather."""
    vocab, tp = ctx.model.vocab_size, ctx.tp
    return (vocab // tp, True) if tp > 1 and vocab % tp == 0 else (vocab, False)


def tied_lm_head_component(ctx: Context) -> Component | None:
    """Gemma's tied LM head, which TGI holds as its own copy of the embedding (GEMMA_TYPES), or None."""
    if not ctx.model.tie_word_embeddings or ctx.model.model_type not in GEMMA_TYPES:
        return None
    rows, _ = lm_head_shard_rows(ctx)
    return band(
        "tied_lm_head",
        rows * ctx.model.hidden_size * dtype_bytes(ctx.dtype),
        0.02,
        0.02,
        FORMULA,
        "the tied LM head loaded again from embed_tokens (Gemma: the embedding is scaled in place)",
    )


def legacy_pool(ctx: Context, prefill_tokens: int, max_total: int, block: int) -> tuple[float, int]:
    """TGI 1.x-2.x: (share of the free memory kept for KV, bytes of the warm-up batch's own blocks added back).

    The warm-up batch is ceil(prefill / max_input) requests, each holding max_total tokens of blocks."""
    requests = -(-prefill_tokens // max(1, max_total - 1))
    batch = requests * -(-max_total // block) * block * ctx.kv_bytes_per_token()
    return _by_release(FREE_SHARE, ctx.version or (2, 4)), batch


def warmup_components(ctx: Context, prefill_tokens: int, extra_band: float = 0.0) -> list[Component]:
    """Everything but the KV pool: context, NCCL, weights, the warm-up prefill peak, CUDA graphs."""
    model, settings, constants = ctx.model, ctx.settings, ctx.constants
    components: list[Component] = [
        ctx.constant_component("cuda_context", "cuda_context_bytes", "CUDA context and library handles"),
    ]
    if ctx.tp > 1:
        components.append(ctx.nccl_component("NCCL communicators"))
    components.append(ctx.weights_component())
    tied = tied_lm_head_component(ctx)
    if tied is not None:
        components.append(tied)
    key = "tgi_prefill_bytes_per_token_hidden"
    per_prefill_token = constants[key] * model.hidden_size
    activation = max(
        forward_peak_bytes(model, prefill_tokens, ctx.tp, ctx.dtype, constants),
        prefill_tokens * per_prefill_token,
    ) + moe_workspace_bytes(model, prefill_tokens, ctx.tp, ctx.dtype, constants)
    rel = constants.band(key) + extra_band
    components.append(
        band(
            "activation_peak",
            activation,
            rel,
            rel,
            constants.provenance(key),
            f"warm-up prefill of --max-batch-prefill-tokens {prefill_tokens}",
        )
    )
    requests = -(
        -prefill_tokens // max(1, (settings.max_model_len or ctx.default_context or prefill_tokens) - 1)
    )
    components.append(warmup_logits_component(ctx, prefill_tokens, extra_band, requests))
    graphs = (
        0.0
        if settings.enforce_eager
        else constants["cuda_graph_base_bytes"]
        + constants["cuda_graph_per_layer_bytes"] * model.num_layers / 2
    )
    if graphs:
        components.append(
            band(
                "cuda_graphs",
                graphs,
                0.6,
                0.6,
                constants.provenance("cuda_graph_base_bytes"),
                "graphs for the default batch sizes, captured after the KV pool",
                in_budget=False,
            )
        )
    return components


def plan(ctx: Context) -> PolicyResult:
    ctx.check_tp("TGI")
    settings = ctx.settings
    max_total = settings.max_model_len or ctx.default_context  # 1.x-2.x cap it (capacity/defaults.py)
    if not max_total:
        raise ConfigError(
            f"the context length of {ctx.model.name} is unknown: pass --max-model-len "
            "(TGI --max-total-tokens)"
        )
    prefill_tokens = (
        settings.max_batch_prefill_tokens
        or settings.max_num_batched_tokens
        or default_prefill_tokens(ctx, max_total)
    )
    if not settings.max_model_len and ctx.version and ctx.version >= FRACTION_WIGGLE_FROM:
        max_total = tgi_warmup_total(
            max_total, prefill_tokens
        )  # 3.x: the warm-up batch's tokens (its note says so)
    memory_fraction = settings.gpu_memory_utilization or 1.0  # CUDA_MEMORY_FRACTION
    block = settings.block_size or (1 if not ctx.version or ctx.version >= FLASHINFER_FROM else 16)
    legacy = ctx.version is not None and ctx.version < FRACTION_WIGGLE_FROM
    # A vision-language model's warm-up also runs its image path (TGI 3.x: one image through the tower and the
    # masked attention of the image tokens), which is not modelled: an unknown term, its band widened as vLLM's.
    vision = bool(ctx.model.vision_params)
    components = warmup_components(
        ctx, prefill_tokens, (LEGACY_BAND if legacy else 0.0) + (UNKNOWN_TERM_BAND if vision else 0.0)
    )
    graphs = sum(c.bytes for c in components if c.name == "cuda_graphs")
    total, other = ctx.total, ctx.other
    share, batch_kv = legacy_pool(ctx, prefill_tokens, max_total, block) if legacy else (1.0, 0)
    wiggle = 1.0 if legacy else card_wiggle(ctx.version)
    wiggle_room = int(total * (1 - memory_fraction * wiggle))

    def kv_rule(parts: list[Component], point: str) -> int:
        free = total - other - pick(parts, point) - wiggle_room
        return int(share * (free - batch_kv) + batch_kv) if legacy else free

    per_token = ctx.kv_bytes_per_token()

    def limits(kv_bytes: int) -> Limits:
        blocks = max(0, kv_bytes) // max(1, per_token * block)
        tokens = blocks * block
        return Limits(int(kv_bytes), int(tokens), int(blocks), tokens / max_total)

    reasons, notes = [], ["max_batch_total_tokens is the pool in tokens; TGI sizes it at warm-up"]
    if vision:
        notes.append(
            "unknown term, band widened (activation peak): the warm-up's image path (vision tower, masked "
            "attention over the image tokens) is not modelled"
        )
    if legacy:
        notes.append(
            "unknown term, band widened: TGI 2.x's warm-up peak was ~2 GiB above weights + activation + "
            "logits in a real TGI 2.2 log (A10G, Llama 3.1 8B); what fills it is not found in 2.2's source"
        )
    window_refusal = tgi_window_refusal(ctx, max_total)
    if window_refusal:
        reasons.append(window_refusal)
    if not legacy and graphs > wiggle_room:
        reasons.append(
            f"CUDA graphs ({gib(graphs, unit=True)}) do not fit the {gib(wiggle_room, unit=True)} wiggle room"
        )
    return PolicyResult(
        components=components,
        budget_bytes=total - wiggle_room,
        kv_rule=kv_rule,
        limits=limits,
        max_model_len=max_total,
        block_size=block,
        kv_bytes_per_token=per_token,
        settings={
            "max_total_tokens": max_total,
            "max_batch_prefill_tokens": prefill_tokens,
            "cuda_memory_fraction": memory_fraction,
            "block_size": block,
            "num_shard": ctx.tp,
            "dtype": ctx.dtype,
        },
        kv_provenance=ENGINE,
        kv_note=(
            f"{share * 100:.0f} % of the memory free after the warm-up peak, plus the warm-up "
            "batch's blocks (TGI 1.x-2.x)"
            if legacy
            else f"free memory after the warm-up peak less {(1 - wiggle) * 100:.0f} % of the card "
            f"(TGI_WIGGLE_ROOM {wiggle})"
        ),
        reasons=reasons,
        min_blocks_needed=-(-max_total // block),
        notes=notes,
    )
