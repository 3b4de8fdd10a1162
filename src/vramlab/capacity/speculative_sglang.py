"""SGLang's speculative decoding: where the draft's weights and KV come from, by release.

Read in the 0.4.9, 0.5.2, 0.5.3, 0.5.6-0.5.15 and 0.5.23 wheels (python/sglang/srt/server_args.py,
model_executor/model_runner.py, model_runner_kv_cache_mixin.py, model_executor/pool_configurator.py,
speculative/eagle_worker.py):

- to 0.5.13 the target worker sizes its pool first (`profile_max_num_token` with the target's cell alone), then the
  draft worker loads its weights and allocates a pool of the same number of tokens in its own cell
  (`draft_runner_cache_size`): both come out of the (1 - mem_fraction_static) reserve, which the default fraction
  widens by 2 GiB (4 GiB from 0.5.10; 6 GiB for a STANDALONE draft model) (sgl-project/sglang issue 6875, the
  user report of sgl-project/sglang issue 31588);
- to 0.5.6 both pools also get `max_num_reqs x (steps x topk + num_draft_tokens) + 100` tokens on top of the
  profiled ones;
- from 0.5.14 (PR #23862) the draft's weights load before the profile and the cell is scaled by the draft's layers.

EAGLE drafts and MTP (NEXTN) layers take the target's embedding and LM head (`set_embed_and_head`), EAGLE-3 the
embedding only (`set_embed`); a STANDALONE draft keeps everything. The draft's own CUDA graphs are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable

from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import ENGINE, Component, Limits, band
from vramlab.capacity.speculative import (
    SGLANG_DRAFT_IN_BUDGET_FROM,
    SGLANG_GLM_SMALL_FROM,
    SGLANG_MTP_FAMILY,
    SGLANG_MTP_FAMILY_057,
    SGLANG_NAMES,
    SGLANG_OTHER_SMALL_FROM,
    SGLANG_SPEC_HEADROOM_BEFORE,
    SGLANG_SPEC_RESERVE_4G_FROM,
    SGLANG_STANDALONE_RESERVE_MIB,
    DraftPlan,
    cell_bytes,
    draft_kv_shapes,
    draft_model,
    draft_name,
    rule_minus,
    scaled_limits,
    weights_component,
    with_draft,
)
from vramlab.units import gib


def sglang_reserve_mib(ctx: Context) -> float:
    """What the default mem_fraction_static keeps back for the draft (server_args `_handle_gpu_memory_settings`)."""
    spec, version = ctx.settings.speculative, ctx.version
    if spec is None or spec.method == "ngram" or (version and version >= SGLANG_DRAFT_IN_BUDGET_FROM):
        return 0.0
    if spec.method == "draft_model":
        return float(SGLANG_STANDALONE_RESERVE_MIB)
    return 4096.0 if not version or version >= SGLANG_SPEC_RESERVE_4G_FROM else 2048.0


def auto_params(ctx: Context) -> tuple[int, int, int]:
    """(speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens) as SGLang resolves them
    (`auto_choose_speculative_params`; with topk 1 the draft tokens are steps + 1)."""
    spec = ctx.settings.speculative
    assert spec is not None
    arch, version = ctx.model.architecture, ctx.version
    family = SGLANG_MTP_FAMILY + (
        SGLANG_MTP_FAMILY_057 if not version or version >= SGLANG_GLM_SMALL_FROM else ()
    )
    if spec.method == "draft_model" or arch in family:
        base = (3, 1, 4)
    elif arch in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"):
        base = (5, 4, 8)
    else:
        base = (3, 1, 4) if not version or version >= SGLANG_OTHER_SMALL_FROM else (5, 4, 8)
    steps = spec.num_speculative_tokens or base[0]
    topk = spec.eagle_topk or base[1]
    tokens = steps + 1 if topk == 1 else (spec.num_draft_tokens or base[2])
    return steps, topk, tokens


def sizing_layers(ctx: Context) -> int:
    """The draft layers SGLang 0.5.14+ scales the cell by (`eagle_draft_num_layers`: num_nextn_predict_layers, else
    the draft config's layers)."""
    draft = draft_model(ctx)
    return draft.num_layers if draft is not None else 0


def plan_sglang(ctx: Context, r: PolicyResult) -> PolicyResult:
    spec = ctx.settings.speculative
    assert spec is not None
    name = SGLANG_NAMES[spec.method]
    steps, topk, draft_tokens = auto_params(ctx)
    if spec.method == "ngram":
        plan = DraftPlan("ngram", None, 0, 0, 0, 0, "no draft pool", steps, False)
        note = (
            f"speculative decoding (NGRAM): no draft weights or KV; max_running_requests "
            f"{ctx.settings.max_num_seqs} (SGLang's default with speculative decoding is 48)"
        )
        return with_draft(r, plan, r.components, [note])
    if ctx.version and ctx.version >= SGLANG_DRAFT_IN_BUDGET_FROM:
        return _in_budget(ctx, r, name, steps)
    return _after_pool(ctx, r, name, (steps, topk, draft_tokens))


def _in_budget(ctx: Context, r: PolicyResult, name: str, steps: int) -> PolicyResult:
    comp = weights_component(
        ctx,
        True,
        "; loaded before the pool is profiled: counted against mem_fraction_static (SGLang 0.5.14+)",
    )
    components = r.components + [comp]
    target_cell = r.kv_bytes_per_token
    draft_cell = cell_bytes(draft_kv_shapes(ctx))
    layers = max(1, sum(shape.layers for shape in ctx.kv_shapes()))
    sized = int(target_cell * (1 + sizing_layers(ctx) / layers))
    kv_rule = rule_minus(r.kv_rule, ("draft_weights",))
    limits = scaled_limits(r.limits, target_cell, sized)
    tokens = limits(max(0, kv_rule(components, "mid"))).kv_cache_tokens
    plan = DraftPlan(
        ctx.settings.speculative.method if ctx.settings.speculative else "",
        draft_name(ctx),
        comp.bytes,
        tokens * draft_cell,
        draft_cell,
        0,
        "none: the pools are sized together",
        steps,
        True,
    )
    note = (
        f"speculative decoding ({name}): SGLang {ctx.settings.resolved_version} sizes one budget for the target's and "
        f"the draft's pools at {sized:,} B per token (the target's {target_cell:,} x (1 + {sizing_layers(ctx)}/{layers} "
        f"draft layers, taken at the target's shape)); the draft's own layers cost {draft_cell:,} B: "
        f"{gib(tokens * draft_cell, unit=True)} of the pool"
    )
    if draft_cell > sized - target_cell:
        over = tokens * (draft_cell - (sized - target_cell))
        note += f", {gib(over, unit=True)} more than SGLang budgeted for it (allocated after the profile)"
    return with_draft(
        r,
        plan,
        components,
        [note],
        kv_rule=kv_rule,
        limits=limits,
        kv_bytes_per_token=target_cell + draft_cell,
        kv_note=r.kv_note + f", less the draft's weights; tokens sized at {sized:,} B (target and draft)",
    )


def _after_pool(ctx: Context, r: PolicyResult, name: str, params: tuple[int, int, int]) -> PolicyResult:
    steps, topk, draft_tokens = params
    version = ctx.version
    requests = int(ctx.settings.max_num_seqs or 48)
    headroom = (
        requests * (steps * topk + draft_tokens) + 100
        if version and version < SGLANG_SPEC_HEADROOM_BEFORE
        else 0
    )
    target_cell, draft_cell = r.kv_bytes_per_token, cell_bytes(draft_kv_shapes(ctx))
    tokens = {p: r.limits(max(0, r.kv_rule(r.components, p))).kv_cache_tokens for p in ("mid", "high", "low")}
    kv = {p: (t + headroom) * draft_cell if t else 0 for p, t in tokens.items()}
    weights = weights_component(ctx, False, "; loaded after the target's pool is sized: out of the reserve")
    components: list[Component] = r.components + [
        weights,
        Component(
            "draft_kv",
            kv["mid"],
            min(kv["high"], kv["mid"]),
            max(kv["low"], kv["mid"]),
            ENGINE,
            f"the draft's pool: as many tokens as the target's ({draft_cell:,} B each, its own layers), allocated after "
            "the target's: out of the reserve",
            in_budget=False,
        ),
    ]
    if headroom:
        components.append(
            band(
                "speculative_slots",
                headroom * target_cell,
                0.0,
                0.0,
                ENGINE,
                f"{headroom:,} more target-pool tokens: {requests} requests x ({steps} steps x top-{topk} + "
                f"{draft_tokens} draft tokens) + 100 (SGLang to 0.5.6)",
                in_budget=False,
            )
        )
    plan = DraftPlan(
        ctx.settings.speculative.method if ctx.settings.speculative else "",
        draft_name(ctx),
        weights.bytes,
        kv["mid"],
        draft_cell,
        headroom,
        "tokens SGLang adds to the target's and the draft's pools for draft and verify tokens",
        steps,
        False,
    )
    return with_draft(
        r,
        plan,
        components,
        [f"speculative decoding ({name}): steps {steps}, top-k {topk}, {draft_tokens} draft tokens"],
        limits=_plus_tokens(r, headroom),
        reasons=r.reasons + _reserve_refusal(ctx, r, components, weights.bytes + kv["mid"]),
    )


def _plus_tokens(r: PolicyResult, headroom: int) -> Callable[[int], Limits]:
    limits, length = r.limits, max(1, r.max_model_len)

    def wrapped(kv: int) -> Limits:
        lim = limits(kv)
        tokens = lim.kv_cache_tokens + headroom if lim.kv_cache_tokens > 0 else 0
        return Limits(lim.kv_cache_bytes, tokens, tokens, tokens / length)

    return wrapped


def _reserve_refusal(ctx: Context, r: PolicyResult, components: list[Component], draft: int) -> list[str]:
    reserve = r.extra.get("reserved_bytes", 0)
    assert isinstance(reserve, int)
    outside = sum(c.bytes for c in components if not c.in_budget)
    if outside <= reserve:
        return []
    fraction = r.settings.get("mem_fraction_static")
    return [
        f"the draft's weights and KV ({gib(draft, unit=True)}) with activations, CUDA graphs and the request-to-token "
        f"map need {gib(outside, unit=True)} of the {gib(reserve, unit=True)} that mem_fraction_static {fraction} leaves: "
        f"SGLang {ctx.settings.resolved_version} loads the draft after sizing the target's pool (lower "
        "--mem-fraction-static)"
    ]
