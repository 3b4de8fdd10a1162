"""SGLang's online FP8 (`--quantization fp8` on a bf16 checkpoint): the checkpoint loads in bf16, then each
module quantizes (model_loader/loader.py `load_weights_and_postprocess`, layers/quantization/fp8.py), and
Qwen3-MoE 0.4.7-0.5.8 keeps its bf16 experts referenced (models/qwen3_moe.py `routed_experts_weights_of_layer`).
What is left is read with mem_get_info after empty_cache, so the allocator's segments count (allocator.py)."""

from __future__ import annotations

import dataclasses

from vramlab.capacity import GIB, Constants, EngineSettings, estimate, get_gpu
from vramlab.capacity import allocator as A
from vramlab.capacity.engines.common import Context
from vramlab.capacity.engines.sglang import online_fp8_load
from vramlab.sources import resolve_model

MIB = 1 << 20


def test_freed_segments_merge_and_empty_cache_returns_them():
    heap = A.Allocator()
    first, second = heap.alloc(9 * MIB), heap.alloc(9 * MIB)  # one 20 MiB segment, 2 MiB split off
    assert heap.reserved() == 20 * MIB
    heap.release(first)
    heap.empty_cache()
    assert heap.reserved() == 20 * MIB  # the second tensor still lives in the segment
    heap.release(second)  # merges with the freed first block and the 2 MiB remainder
    heap.empty_cache()
    assert heap.reserved() == 0


def test_a_quantized_copy_in_a_freed_segment_keeps_it_reserved():
    # Load a 128 MiB and a 64 MiB bf16 weight; quantize module by module:
    #  module 1: its 64 MiB FP8 copy finds no free block -> new 64 MiB segment; the 128 MiB bf16 is freed.
    #  module 2: its 32 MiB FP8 copy best-fits the free 128 MiB block -> split (96 MiB free left in that
    #            segment); the 64 MiB bf16 is freed and its segment is whole again.
    # empty_cache returns only the 64 MiB bf16 segment: 128 + 64 = 192 MiB stay reserved for 96 MiB of FP8.
    heap = A.Allocator()
    bf16 = [heap.alloc(128 * MIB), heap.alloc(64 * MIB)]
    heap.alloc(64 * MIB)
    heap.release(bf16[0])
    heap.alloc(32 * MIB)
    heap.release(bf16[1])
    assert heap.reserved() == 256 * MIB  # the load's peak: nothing returned before empty_cache
    heap.empty_cache()
    assert heap.reserved() == 192 * MIB


def _ctx(version: str, model: str = "qwen3-235b-a22b", quantization: str | None = "fp8") -> Context:
    s = EngineSettings(
        engine="sglang", engine_version=version, tensor_parallel_size=8, quantization=quantization
    )
    return Context(resolve_model(model, offline=True), get_gpu("h200"), s, Constants.defaults())


def test_qwen3_moe_keeps_its_bf16_experts_in_the_releases_that_build_the_dict_eagerly():
    # Qwen3-235B-A22B at TP 8: 94 MoE layers, 128 experts, moe_intermediate 1536 / 8 = 192, hidden 4096, bf16.
    # Per layer: w13 128 x (2 x 192) x 4096 x 2 B = 402,653,184 B and w2 128 x 192 x 4096 x 2 B = 201,326,592 B;
    # x 94 layers = 56,774,098,944 B (52.88 GiB) still referenced by routed_experts_weights_of_layer.
    load = online_fp8_load(_ctx("0.5.2"))
    assert load is not None
    assert load.kept_bf16_bytes == 56_774_098_944
    for version in ("0.4.6", "0.5.9"):  # before the dict (0.4.6.post3) / LazyValue from 0.5.9
        other = online_fp8_load(_ctx(version))
        assert other is not None and other.kept_bf16_bytes == 0
    assert online_fp8_load(_ctx("0.5.2", model="qwen3-235b-a22b-fp8")) is None  # FP8 checkpoint: loads FP8
    assert online_fp8_load(_ctx("0.5.2", quantization=None)) is None


def test_pipeline_stages_keep_their_share_of_the_experts_as_a_logged_start_shows():
    # PP 4 x TP 8: the 94 layers' kept experts (56,774,098,944 B at TP 8, above) split over 4 stages:
    # 14,193,524,736 B per GPU. A Qwen3-235B-A22B start on 4 x 8 H200 (PP 4, TP 8, SGLang 0.4.9) logged
    # "mem usage=13.73 GB" after loading in bf16 and 19.99 GB with --quantization fp8 (x 1.456); FP8 weights
    # plus the kept bf16 experts plan x 1.48 of the bf16 plan.
    s = EngineSettings(
        engine="sglang",
        engine_version="0.4.9",
        tensor_parallel_size=8,
        pipeline_parallel_size=4,
        quantization="fp8",
    )
    ctx = Context(resolve_model("qwen3-235b-a22b", offline=True), get_gpu("h200"), s, Constants.defaults())
    load = online_fp8_load(ctx)
    assert load is not None and load.kept_bf16_bytes == 14_193_524_736
    bf16 = estimate(ctx.model, get_gpu("h200"), dataclasses.replace(s, quantization=None))
    fp8 = estimate(ctx.model, get_gpu("h200"), s)
    assert 1.40 < fp8.weights_bytes / bf16.weights_bytes < 1.55
    later = dataclasses.replace(s, engine_version="0.5.9")  # the dict is lazy from 0.5.9: FP8 weights only
    assert estimate(ctx.model, get_gpu("h200"), later).weights_bytes < 0.6 * bf16.weights_bytes


def test_the_plan_charges_the_kept_experts_and_refuses_a_load_that_cannot_fit():
    m = resolve_model("qwen3-235b-a22b", offline=True)

    def plan(version: str, gpu: str = "h200") -> tuple[int, int, tuple[str, ...]]:
        s = EngineSettings(
            engine="sglang", engine_version=version, tensor_parallel_size=8, quantization="fp8"
        )
        est = estimate(m, get_gpu(gpu), s)
        return est.weights_bytes, est.kv_cache_bytes, est.reasons

    kept_w, kept_kv, _ = plan("0.5.8")
    lazy_w, lazy_kv, _ = plan("0.5.9")  # same mem_fraction_static rule (0.5.3+), no kept experts
    # The weights differ by the kept experts, give or take the allocator remainders (< 0.5 GiB either way).
    assert abs(kept_w - lazy_w - 56_774_098_944) < GIB // 2
    assert abs((lazy_kv - kept_kv) - (kept_w - lazy_w)) < GIB // 100  # the pool loses what the weights gain
    # On 80 GB cards the bf16 model (55.5 GiB) plus the FP8 copies cannot load: SGLang OOMs while loading.
    _, _, reasons = plan("0.5.2", gpu="h100-80gb")
    assert any("online FP8 loads the checkpoint in bfloat16" in r for r in reasons)
