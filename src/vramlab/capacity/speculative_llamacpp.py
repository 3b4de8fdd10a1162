"""llama.cpp's draft model (`-md`): its own weights, KV cache and compute buffer, by build.

tools/server/server.cpp (read in llama-cpp-python 0.3.16's vendored copy) loads the draft with the target's
parameters but `n_ctx` = `-cd` or n_ctx / n_parallel, `n_parallel` 1, `-ngld` layers on the GPU and `-ctkd` /
`-ctvd` cache types (f16 by default), then creates one draft context per slot (`slot.ctx_dft =
llama_init_from_model(model_dft, cparams_dft)`): every slot holds its own draft KV and compute buffer. From PR
#22838 (common/speculative.cpp `common_speculative_init_result`, read in llama-cpp-python 0.3.36's vendored copy)
one draft context serves every slot: "the draft context holds as many tokens per sequence as the target context"
(`cparams.n_ctx = llama_n_ctx(ctx_tgt)`), with the target's slots and n_ubatch and n_parallel output rows. The
draft's layers follow llama.cpp's placement (`-ngld`: the last N layers; default every layer).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramlab.capacity.engines import llamacpp as lcpp
from vramlab.capacity.engines import llamacpp_placement as place
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import FORMULA, Component, band
from vramlab.capacity.speculative import (
    LLAMACPP_DRAFT_CACHE_TYPE,
    LLAMACPP_SHARED_DRAFT_CTX_FROM,
    DraftPlan,
    with_draft,
)
from vramlab.units import gib


def draft_context(ctx: Context) -> Context:
    """The draft as llama.cpp loads it: its own GGUF (or the target's --quantization for a catalog name), the
    target's flags otherwise."""
    spec = ctx.settings.speculative
    assert spec is not None and spec.draft is not None
    settings = ctx.settings.with_(
        speculative=None,
        quantization=None if spec.draft.quant is not None else ctx.settings.quantization,
        kv_cache_dtype=spec.draft_cache_type_k or LLAMACPP_DRAFT_CACHE_TYPE,
        cache_type_v=spec.draft_cache_type_v or spec.draft_cache_type_k or LLAMACPP_DRAFT_CACHE_TYPE,
        n_gpu_layers=spec.draft_n_gpu_layers,
        override_tensor=(),
        n_cpu_moe=0,
        tensor_split=None,
        devices=(),
        pipeline_parallel_size=1,
    )
    return Context(spec.draft, ctx.gpu, settings, ctx.constants)


def draft_server(ctx: Context, dctx: Context, server: lcpp.ServerSetup) -> tuple[lcpp.ServerSetup, int, int]:
    """(the draft contexts' setup, cells in each, how many contexts) for this build."""
    spec = ctx.settings.speculative
    assert spec is not None
    shared = not ctx.version or ctx.version >= LLAMACPP_SHARED_DRAFT_CTX_FROM
    type_k = dctx.settings.kv_cache_dtype
    type_v = dctx.settings.cache_type_v or type_k
    if shared:
        setup = replace(server, type_k=type_k, type_v=type_v, notes=())
        return setup, lcpp.kv_cells(ctx, server), 1
    n_ctx = spec.draft_ctx_size or max(1, server.n_ctx // max(1, server.slots))
    setup = replace(
        server,
        n_ctx=n_ctx,
        slots=1,
        unified=False,
        per_slot_context=n_ctx,
        type_k=type_k,
        type_v=type_v,
        notes=(),
    )
    return setup, lcpp._pad(n_ctx), server.slots


def plan_llamacpp(ctx: Context, r: PolicyResult) -> PolicyResult:
    spec = ctx.settings.speculative
    assert spec is not None and spec.draft is not None
    dctx = draft_context(ctx)
    server = lcpp.resolve_server(ctx)
    dserver, cells, contexts = draft_server(ctx, dctx, server)
    draft = spec.draft
    layers = draft.num_layers
    ngl = (
        layers + 1
        if spec.draft_n_gpu_layers is None or spec.draft_n_gpu_layers < 0
        else spec.draft_n_gpu_layers
    )
    on_gpu = min(ngl, layers)
    weights_all = lcpp.weights_on_device(dctx).bytes
    weights = weights_all if ngl > layers else int(weights_all * on_gpu / max(1, layers))
    kv_all = lcpp.kv_cache_bytes(dctx, dserver, cells, range(layers)) * contexts
    kv = int(kv_all * on_gpu / max(1, layers))
    shared = not ctx.version or ctx.version >= LLAMACPP_SHARED_DRAFT_CTX_FROM
    # the shared context has n_parallel output rows (PR #23988); a slot's own context n_batch = its n_ctx, so its
    # ubatch (and the logits it reserves) is at most that
    n_ubatch = dserver.n_ubatch if shared else min(dserver.n_ubatch, cells)
    outputs = dserver.slots if shared else n_ubatch
    p = place.phases(draft, cells, n_ubatch, outputs, dserver.flash_attn)
    scratch = int(ctx.constants["llamacpp_compute_scratch_bytes"])
    compute = (max(p.attention, p.ffn_gpu, p.output) + scratch) * contexts if on_gpu else 0
    components = r.components + _components(ctx, weights, kv, compute, cells, contexts, on_gpu, layers)
    report, reasons = _device_report(r, weights + kv + compute)
    host_before = r.extra.get("host") or {}
    assert isinstance(host_before, dict)
    host = {
        **host_before,
        "draft_model_buffer_bytes": weights_all - weights,
        "draft_kv_buffer_bytes": kv_all - kv,
    }
    plan = DraftPlan(
        "draft_model",
        draft.name,
        weights,
        kv,
        int(kv / cells / contexts) if cells else 0,
        0,
        f"none; {contexts} draft context(s) of {cells:,} cells" + (" (one per slot)" if contexts > 1 else ""),
        spec.num_speculative_tokens,
        False,
    )
    note = (
        f"draft model {draft.name}: {contexts} draft context(s) of {cells:,} cells (llama.cpp b"
        f"{ctx.settings.resolved_version.lstrip('b')}), KV in {dserver.type_k}/{dserver.type_v}, "
        f"{on_gpu}/{layers} layers on the GPU"
    )
    notes = [note]
    if r.settings.get("fit"):
        notes.append(
            "not modelled: llama-server's --fit measures the draft with the target (common/fit.cpp "
            "`common_fit_extra_model`) and places both; here the target is fitted alone and the draft added on top, "
            "so the verdict is --fit off's (pass --fit off to plan exactly that)"
        )
    out = with_draft(r, plan, components, notes, reasons=r.reasons + reasons)
    return replace(out, extra={**out.extra, "devices": report, "host": host})


def _components(
    ctx: Context, weights: int, kv: int, compute: int, cells: int, contexts: int, on_gpu: int, layers: int
) -> list[Component]:
    where = f"{on_gpu}/{layers} layers on the GPU"
    rel = ctx.constants.band("llamacpp_compute_scratch_bytes")
    return [
        band("draft_weights", weights, 0.005, 0.005, FORMULA, f"the draft's model buffer ({where})"),
        band(
            "draft_kv",
            kv,
            0.0,
            0.0,
            FORMULA,
            f"{contexts} x {cells:,} cells x the draft's layers (K and V in their -ctkd / -ctvd types)",
        ),
        band(
            "draft_compute",
            compute,
            rel,
            rel,
            ctx.constants.provenance("llamacpp_compute_scratch_bytes"),
            f"compute buffer of {contexts} draft context(s)",
        ),
    ]


def _device_report(r: PolicyResult, draft_bytes: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Device 0 (the main GPU, where the draft's offloaded layers go) with the draft's buffers added."""
    given = r.extra.get("devices") or []
    assert isinstance(given, list)
    devices = [dict(d) for d in given]
    reasons: list[str] = []
    if devices:
        main = devices[0]
        was_short = int(main["headroom_bytes"]) < 0
        main["draft_buffers_bytes"] = draft_bytes
        main["total_bytes"] = int(main["total_bytes"]) + draft_bytes
        main["headroom_bytes"] = int(main["headroom_bytes"]) - draft_bytes
        if main["headroom_bytes"] < 0 and not was_short:
            reasons.append(
                f"llama.cpp would allocate the draft model's buffers ({gib(draft_bytes, unit=True)}) on "
                f"{main['device']} ({main['gpu']}) with {gib(draft_bytes + int(main['headroom_bytes']), unit=True)} "
                "left (cudaMalloc failed: out of memory); lower -ngld or the draft's context (-cd)"
            )
    return devices, reasons
