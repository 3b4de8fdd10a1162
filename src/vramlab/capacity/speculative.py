"""Speculative decoding in the plan: the draft's weights, its KV cache and the extra slots, per engine and release.

`--speculative-config` (vLLM), `--speculative-algorithm` and its `--speculative-*` flags (SGLang) and `-md` (llama.cpp)
resolve to one `Speculative` (capacity/settings.py); `prepare` applies what the engine changes in its own settings
before sizing anything, and `apply` adds the draft to the engine policy's result. What each engine allocates, read in
its source (the wheels and builds named beside each rule below):

- vLLM V1 (vllm/v1/worker/gpu_model_runner.py `load_model`, 0.29.0): the drafter loads inside the target's memory
  profiler, so its weights count in "Model loading took" (in the budget). Its attention layers register KV cache specs
  of their own and join the target's pool (`LLMBaseProposer.load_model`: `_draft_attn_layer_names`): every token
  costs the target's layers and the draft's (capacity/engines/common.py adds them to the last stage's KV shapes).
  EAGLE and MTP drafters reuse the target's embedding and LM head (`_maybe_share_embeddings`, `_maybe_share_lm_head`);
  an EAGLE-3 head keeps its own LM head over `draft_vocab_size`. Each running request reserves `num_lookahead_tokens`
  (num_speculative_tokens for EAGLE, MTP and draft models) slots past its tokens (vllm/config/vllm.py). V0 profiled
  the target alone (vllm issue 9995; PR 14067 to count the draft was closed unmerged): the draft's weights sit in
  the 1 - util headroom.
- SGLang (model_executor/model_runner.py, server_args.py): capacity/speculative_sglang.py.
- llama.cpp (tools/server): capacity/speculative_llamacpp.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from vramlab.capacity import kv as kvmod
from vramlab.capacity import weights as wmod
from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.estimate import FORMULA, Component, Limits, band
from vramlab.capacity.settings import EngineSettings, Speculative
from vramlab.capacity.spec import ModelSpec, dtype_bytes
from vramlab.errors import ConfigError
from vramlab.units import gib

METHODS = ("eagle", "eagle3", "mtp", "draft_model", "ngram")
# SGLang's --speculative-algorithm values, in vLLM's words: NEXTN is EAGLE over the model's own MTP layers
# (server_args `_handle_speculative_decoding`: "NEXTN" -> "EAGLE", the draft path defaulting to the model).
SGLANG_ALGORITHMS = {
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "NEXTN": "mtp",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
}
SGLANG_NAMES = {v: k for k, v in SGLANG_ALGORITHMS.items()}
ENGINES = ("vllm", "sglang", "llama.cpp")
# SGLang server_args `_handle_speculative_decoding` (0.4.9-0.5.23): `max_running_requests = 48` when not given.
SGLANG_SPEC_MAX_RUNNING = 48
# SGLang model_runner `init_memory_pool` (0.4.9, 0.5.2, 0.5.3, 0.5.6): the target's pool gets max_num_reqs x
# (steps x topk + num_draft_tokens) + 100 tokens on top of the profiled ones ("both verify and draft tokens can be
# concurrently allocated"), and the draft pool as many; 0.5.7 drops the headroom (draft pool = target pool).
SGLANG_SPEC_HEADROOM_BEFORE = (0, 5, 7)
# server_args `_handle_gpu_memory_settings`: the default mem_fraction_static reserves 2 GiB more for EAGLE-family
# drafts ("eagle draft models and cuda graphs"; read in 0.4.9, 0.5.2-0.5.9), 4 GiB in 0.5.10-0.5.13, 6 GiB for
# STANDALONE (0.5.2-0.5.13) and nothing for NGRAM; the GPU-bucket era (0.4.7) is when it appears.
SGLANG_SPEC_RESERVE_4G_FROM = (0, 5, 10)
SGLANG_STANDALONE_RESERVE_MIB = 6 * 1024
# PR #23862 (merged 2026-04-27, first in the 0.5.14 wheel): the draft's weights load before the pool is profiled
# (they count against mem_fraction_static) and the cell grows by the draft's layers (pool_configurator.py:
# `cell_size * (1 + eagle_draft_num_layers / num_layers)`, assuming the target's per-layer shape); no reserve added.
SGLANG_DRAFT_IN_BUDGET_FROM = (0, 5, 14)
# auto_choose_speculative_params: (num_steps, eagle_topk, num_draft_tokens) when none is given.
SGLANG_MTP_FAMILY = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "GptOssForCausalLM",
    "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM",
)
SGLANG_MTP_FAMILY_057 = ("Glm4MoeForCausalLM", "MiMoV2FlashForCausalLM")  # join the (3, 1, 4) list in 0.5.7
SGLANG_GLM_SMALL_FROM = (0, 5, 7)
SGLANG_OTHER_SMALL_FROM = (0, 5, 8)  # the "all other models" default went (5, 4, 8) -> (3, 1, 4) in 0.5.8
# llama.cpp PR #17017 (merged 2025-11-05): `-np` auto stays at 1 slot when a draft model is given ("requires a
# separate draft llama_context for each slot"); not pinned to a build: b7040, interpolated between b6451
# (2025-09-13) and b9174 (2026-05-16).
LLAMACPP_DRAFT_ONE_SLOT_FROM = (7040,)
# llama.cpp PR #22838 ("spec : parallel drafting support", merged 2026-05-08, on PR #22787's "single unified draft
# llama_context for all sequences"): one draft context for every slot, with the target's n_ctx and n_parallel
# outputs, and `-np` auto back to 4 slots; before it each slot owned a draft context of -cd (or n_ctx / n_parallel)
# cells with its own compute buffer (tools/server/server.cpp, read in llama-cpp-python 0.3.16's vendored copy).
# Not pinned: b9080, eight days before b9174 (2026-05-16).
LLAMACPP_SHARED_DRAFT_CTX_FROM = (9080,)
LLAMACPP_DRAFT_CACHE_TYPE = (
    "f16"  # common.h `params.speculative.cache_type_k/v = GGML_TYPE_F16` (-ctkd / -ctvd)
)


def check(settings: EngineSettings) -> None:
    """Refuse what no engine would start with, in one line."""
    spec = settings.speculative
    if spec is None:
        return
    engine = settings.engine
    if engine not in ENGINES:
        raise ConfigError(f"speculative decoding is planned for vLLM, SGLang and llama.cpp, not {engine}")
    if spec.method not in METHODS:
        raise ConfigError(f"speculative method {spec.method!r}: expected one of {', '.join(METHODS)}")
    if spec.method in ("eagle", "eagle3", "draft_model") and spec.draft is None:
        raise ConfigError(f"speculative method {spec.method}: name the draft model or head")
    if engine == "llama.cpp" and spec.method != "draft_model":
        raise ConfigError(
            f"llama.cpp: -md plans a draft model; {spec.method} drafting in llama.cpp is not planned"
        )
    if engine == "vllm" and settings.pipeline_parallel_size > 1:
        raise ConfigError(
            "vLLM speculative decoding at -pp > 1 is not planned (the drafter runs on the last stage)"
        )
    for name, value in (
        ("num_speculative_tokens", spec.num_speculative_tokens),
        ("speculative_eagle_topk", spec.eagle_topk),
        ("speculative_num_draft_tokens", spec.num_draft_tokens),
        ("ctx-size-draft", spec.draft_ctx_size),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096
        ):
            raise ConfigError(f"{name}: must be a whole number from 1 to 4096, got {value!r}")


def prepare(settings: EngineSettings) -> EngineSettings:
    """What the engine changes in its own settings when a draft is given, before it sizes anything."""
    spec = settings.speculative
    if spec is None:
        return settings
    check(settings)
    if settings.engine == "sglang" and settings.max_num_seqs is None:
        return settings.with_(max_num_seqs=SGLANG_SPEC_MAX_RUNNING)
    version = settings.version
    one_slot_era = not version or LLAMACPP_DRAFT_ONE_SLOT_FROM <= version < LLAMACPP_SHARED_DRAFT_CTX_FROM
    if settings.engine == "llama.cpp" and settings.parallel is None and one_slot_era and version:
        return settings.with_(parallel=1)
    return settings


def mtp_spec(m: ModelSpec) -> ModelSpec:
    """The model's own multi-token-prediction layers as a model of their own: the decoder layers stored after the
    last one (full attention; MoE where the model is), without the embedding, vision tower or header bytes."""
    if not m.mtp_layers:
        raise ConfigError(
            f"{m.name} has no multi-token-prediction layers (num_nextn_predict_layers / mtp_num_hidden_layers): "
            "MTP needs a model that ships them"
        )
    return m.with_(
        num_layers=m.mtp_layers,
        layer_kinds=None,
        first_k_dense_layers=0,
        moe_layer_freq=1,
        moe_layer_offset=None,
        weights_bytes_exact=None,
        weights_bytes_by_dtype=None,
        param_count_exact=None,
        vision_params=0,
        vision=None,
        mtp_layers=0,
    )


def draft_model(ctx: Context) -> ModelSpec | None:
    """The model whose layers draft: the head or draft given, the model's MTP layers, or None (n-grams)."""
    spec = ctx.settings.speculative
    if spec is None or spec.method == "ngram":
        return None
    return mtp_spec(ctx.model) if spec.method == "mtp" else spec.draft


def head_bytes(draft: ModelSpec, method: str, dtype: str, tp: int) -> int:
    """An EAGLE head on one GPU, the target's embedding and LM head reused (vllm llama_eagle.py / llama_eagle3.py,
    SGLang's `set_embed_and_head` / `set_embed`): its decoder layers and `fc` (2 x hidden -> hidden for EAGLE;
    3 x target hidden for EAGLE-3, replicated); EAGLE-3 also reads [embeds, hidden] in its first layer's qkv
    (2 x hidden inputs), keeps an LM head over `draft_vocab_size` and the int64 `d2t` map."""
    wb = wmod.breakdown(draft, tp)
    unq = dtype_bytes(dtype)
    layers = wb.linear_params + wb.expert_params + wb.other_params
    h = draft.hidden_size
    if method == "eagle":
        return int((layers + 2 * h * h) * unq)
    q = draft.num_attention_heads * draft.head_dim // tp
    kv = max(1, draft.num_kv_heads // tp) * draft.head_dim
    vocab = draft.draft_vocab_size or draft.vocab_size
    lm_head = -(-vocab // wmod.VOCAB_PADDING) * wmod.VOCAB_PADDING // tp * h
    fc = 3 * (draft.target_hidden_size or h) * h
    return int((layers + h * (q + 2 * kv) + fc + lm_head + h) * unq + vocab * 8)


def mtp_bytes(ctx: Context, sub: ModelSpec) -> int:
    """The MTP block on one GPU: its decoder layers (quantized as the model is) plus `eh_proj` (2 x hidden -> hidden,
    a plain linear in the model dtype) and three norms; the embedding and LM head are the target's (vLLM
    deepseek_mtp.py / glm4_moe_mtp.py, SGLang deepseek_nextn.py `set_embed_and_head`)."""
    unq = dtype_bytes(ctx.dtype)
    value, _ = wmod.weight_bytes(sub, ctx.dtype, ctx.settings.quantization, ctx.tp, 1, 0, rope_cache=False)
    wb = wmod.breakdown(sub, ctx.tp)
    q = ctx.quant
    shared = wb.embedding_params * (1 if q is None or not q.quantize_embedding else 0) + wb.lm_head_params
    h = sub.hidden_size
    return int(value - shared * unq + (2 * h * h + 3 * h) * unq)


def draft_weight_bytes(ctx: Context) -> tuple[int, str]:
    """(bytes of the draft's weights on one GPU as the engine keeps them, how they were counted)."""
    spec = ctx.settings.speculative
    assert spec is not None
    draft = draft_model(ctx)
    if draft is None:
        return 0, "n-gram drafting looks tokens up in the prompt: no model"
    if spec.method == "mtp":
        return mtp_bytes(
            ctx, draft
        ), f"{draft.num_layers} MTP layer(s) of the model, its embedding and LM head reused"
    if spec.method in ("eagle", "eagle3"):
        what = (
            "reused, its own LM head over the draft vocabulary"
            if spec.method == "eagle3"
            else "and LM head reused"
        )
        return head_bytes(
            draft, spec.method, ctx.dtype, ctx.tp
        ), f"{spec.method} head, the target's embedding {what}"
    value, how = wmod.weight_bytes(
        draft, ctx.dtype, None if draft.quant else ctx.settings.quantization, ctx.tp, 1, 0, rope_cache=True
    )
    return value, f"draft model {draft.name} ({how}), nothing shared with the target"


def draft_kv_shapes(ctx: Context) -> tuple[kvmod.KVShape, ...]:
    """The draft's KV per token on one GPU, layer kind by kind, from its own architecture."""
    draft = draft_model(ctx)
    if draft is None:
        return ()
    return kvmod.kv_shapes(draft, ctx.settings.kv_cache_dtype, ctx.dtype, ctx.tp, range(draft.num_layers))


def merge_shapes(
    shapes: tuple[kvmod.KVShape, ...], draft: tuple[kvmod.KVShape, ...]
) -> tuple[kvmod.KVShape, ...]:
    """The draft's layers join the target's layers of the same kind and page size (one KV cache group in vLLM's
    `get_kv_cache_groups`); others form their own."""
    out = list(shapes)
    for extra in draft:
        same = next(
            (
                i
                for i, s in enumerate(out)
                if (s.kind, s.bytes_per_token_layer) == (extra.kind, extra.bytes_per_token_layer)
            ),
            None,
        )
        if same is None:
            out.append(extra)
        else:
            out[same] = replace(out[same], layers=out[same].layers + extra.layers)
    return tuple(out)


def shares_pool(ctx: Context) -> bool:
    """vLLM: the draft's layers are layers of the one KV pool (the last pipeline stage's)."""
    return ctx.settings.engine == "vllm" and ctx.settings.speculative is not None


@dataclass(frozen=True)
class DraftPlan:
    """What the draft adds, for the plan's JSON (`speculative`) and text."""

    method: str
    draft: str | None
    weights_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    extra_slots: int  # tokens of KV the engine keeps beyond the requests' own (per request or in all)
    extra_slots_meaning: str
    num_speculative_tokens: int | None
    in_pool: bool  # the draft's KV is carved out of the engine's KV pool (vLLM, SGLang 0.5.14+)

    def to_json(self) -> dict[str, object]:
        return {
            "method": self.method,
            "draft": self.draft,
            "draft_weights_bytes": self.weights_bytes,
            "draft_kv_bytes": self.kv_bytes,
            "draft_kv_bytes_per_token": self.kv_bytes_per_token,
            "draft_kv_in_pool": self.in_pool,
            "extra_slots": self.extra_slots,
            "extra_slots_meaning": self.extra_slots_meaning,
            "num_speculative_tokens": self.num_speculative_tokens,
        }


def weights_component(ctx: Context, in_budget: bool, note: str = "") -> Component:
    value, how = draft_weight_bytes(ctx)
    return band("draft_weights", value, 0.03, 0.03, FORMULA, how + note, in_budget=in_budget)


def apply(ctx: Context, r: PolicyResult) -> PolicyResult:
    """The policy's result with the draft in it."""
    if ctx.settings.speculative is None:
        return r
    engine = ctx.settings.engine
    if engine == "vllm":
        return _vllm(ctx, r)
    if engine == "sglang":
        from vramlab.capacity.speculative_sglang import plan_sglang

        return plan_sglang(ctx, r)
    from vramlab.capacity.speculative_llamacpp import plan_llamacpp

    return plan_llamacpp(ctx, r)


def with_draft(
    r: PolicyResult, plan: DraftPlan, components: list[Component], notes: list[str], **changes: object
) -> PolicyResult:
    extra = {**r.extra, "speculative": plan.to_json()}
    return replace(r, components=components, notes=r.notes + notes, extra=extra, **changes)  # type: ignore[arg-type]


def _vllm(ctx: Context, r: PolicyResult) -> PolicyResult:
    spec = ctx.settings.speculative
    assert spec is not None
    v0 = r.settings.get("engine_mode") == "v0"
    comp = weights_component(
        ctx,
        in_budget=not v0,
        note="; V0 profiles the target alone (vllm issue 9995): outside the budget, in the 1 - util headroom"
        if v0
        else "; loaded inside the target's memory profile (counted in 'Model loading took')",
    )
    components = r.components + [comp]
    per_token = sum(s.layers * s.bytes_per_token_layer for s in draft_kv_shapes(ctx))
    k = spec.num_speculative_tokens or (ctx.model.mtp_layers if spec.method == "mtp" else None)
    if k is None and spec.method != "ngram":
        raise ConfigError('vLLM: --speculative-config needs "num_speculative_tokens"')
    kv_mid = max(0, r.kv_rule(components, "mid"))
    share = int(kv_mid * per_token / r.kv_bytes_per_token) if r.kv_bytes_per_token else 0
    lookahead = 0 if spec.method == "ngram" else int(k or 0)
    plan = DraftPlan(
        spec.method,
        draft_name(ctx),
        comp.bytes,
        share,
        per_token,
        lookahead,
        "KV slots each running request reserves past its tokens (num_lookahead_tokens)",
        k,
        True,
    )
    notes = []
    if per_token:
        notes.append(
            f"speculative decoding ({spec.method}): the draft's layers share vLLM's KV pool, {per_token:,} of the "
            f"{r.kv_bytes_per_token:,} B per token ({gib(share, unit=True)} of the pool); each request reserves "
            f"{lookahead} lookahead slot(s)"
        )
    notes.append(
        "unknown term, not modelled: the drafter's dummy forward, its CUDA graphs and the rejection sampler's "
        "warm-up at start-up"
    )
    return with_draft(r, plan, components, notes)


def draft_name(ctx: Context) -> str | None:
    spec = ctx.settings.speculative
    if spec is None or spec.method == "ngram":
        return None
    if spec.method == "mtp":
        return f"{ctx.model.name} MTP layers"
    return spec.draft.name if spec.draft else None


def cell_bytes(shapes: tuple[kvmod.KVShape, ...]) -> int:
    return sum(s.layers * s.bytes_per_token_layer for s in shapes)


def scaled_limits(
    limits: Callable[[int], Limits], target_cell: int, sized_cell: int
) -> Callable[[int], Limits]:
    """Tokens sized by a larger cell: the pool's bytes hold fewer of them."""

    def wrapped(kv: int) -> Limits:
        lim = limits(int(kv * target_cell / sized_cell) if sized_cell else kv)
        return Limits(kv, lim.kv_cache_tokens, lim.num_blocks, lim.max_concurrency)

    return wrapped


def rule_minus(
    kv_rule: Callable[[list[Component], str], int], names: tuple[str, ...]
) -> Callable[[list[Component], str], int]:
    """A KV rule that also takes *names* off the pool."""

    def wrapped(parts: list[Component], point: str) -> int:
        return int(kv_rule(parts, point) - pick(parts, point, names))

    return wrapped


__all__ = ["Speculative", "apply", "check", "prepare"]
