"""The KV band the plan prints: which term widens it most, and a term that is not modelled said as such."""

from __future__ import annotations

from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.planning import make_plan
from vramlab.report.plan_text import render_plan
from vramlab.sources.catalog import get_entry

H100 = get_gpu("h100-80gb")


def test_the_band_is_signed_and_names_its_widest_term() -> None:
    spec = get_entry("llama-3.1-8b-instruct").spec()
    est = estimate(spec, H100, EngineSettings(engine_version="0.10.1", max_model_len=8192))
    low, high = est.extra["kv_band_bytes"]
    kv = est.component("kv_cache")
    assert kv is not None
    assert (low, high) == (kv.low_bytes, kv.high_bytes)  # positive here: the same band as the component's
    widest = est.extra["kv_band_widest"]
    assert widest in {c.name for c in est.components if c.in_budget}
    # held alone at its high end, the widest term moves the pool at least as far as any other term
    assert widest != "kv_cache"


def test_a_failed_start_keeps_the_band_signed() -> None:
    spec = get_entry("llama-3.1-70b-instruct").spec()
    est = estimate(
        spec, H100, EngineSettings(engine_version="0.10.1", max_model_len=8192), with_suggestions=False
    )
    low, high = est.extra["kv_band_bytes"]
    assert low < est.kv_available_bytes < 0 and est.kv_cache_bytes == 0


def test_the_flashinfer_sampler_of_022_on_is_sized_from_the_source_not_widened_as_unknown() -> None:
    """0.22+ runs FlashInfer by default; the source (vLLM 0.22.0/0.29.0 with FlashInfer 0.6.11.post2/0.6.18) gives
    its tensors: the logits + 3 fp32 copies, and the native warm-up run after it. No unknown-term widening, and the
    activation band is the larger run's, not 0 to twice the point."""
    spec = get_entry("llama-3.1-70b-instruct").spec()
    s = EngineSettings(engine_version="0.29.0", tensor_parallel_size=2, max_model_len=8192)
    p = make_plan(spec, H100, s)
    act = p.estimate.component("activation_peak")
    assert act is not None and "sized from the source" in act.note
    assert not any(n.startswith("unknown term") for n in p.estimate.notes)
    assert act.low_bytes > 0.7 * act.bytes and act.high_bytes < 1.3 * act.bytes
    # 1024 sequences x 128,256 entries: the FlashInfer run (2 + 12 B) is below the Triton warm-up (15.6 B): that sets it
    seqs, vocab = 1024, spec.vocab_size
    assert act.bytes >= seqs * vocab * 15.6 * 0.99
    # opting out of FlashInfer (the Triton path alone) gives the same peak: the warm-up run dominated
    off = make_plan(spec, H100, s.with_(flashinfer_sampler=False)).estimate.component("activation_peak")
    assert off is not None and abs(off.bytes - act.bytes) < 0.02 * act.bytes
    # before 0.22 FlashInfer (opt-in) keeps its measured constant and its wide band
    old = make_plan(spec, H100, s.with_(engine_version="0.20.0", flashinfer_sampler=True)).estimate
    old_act = old.component("activation_peak")
    assert old_act is not None and "sized from the source" not in old_act.note


def test_plan_text_says_when_the_widest_term_is_an_unknown_one() -> None:
    spec = get_entry("llama-3.1-8b-instruct").spec()
    gpu = get_gpu("mi300x")
    p = make_plan(spec, gpu, EngineSettings(engine="sglang"))
    text = render_plan(p, spec, gpu)
    line = next(x for x in text.splitlines() if x.startswith("KV band:"))
    assert "(an unknown term: see its note)" in line, line


def test_tgi_widens_a_vision_models_warm_up_and_says_so() -> None:
    gpu = get_gpu("a100-80gb")
    vlm = estimate(
        get_entry("gemma-3-27b-it").spec(), gpu, EngineSettings(engine="tgi", tensor_parallel_size=2)
    )
    text = get_entry("llama-3.1-8b-instruct").spec()
    plain = estimate(text, gpu, EngineSettings(engine="tgi"))
    act = vlm.component("activation_peak")
    assert act is not None
    rel = (act.high_bytes - act.bytes) / act.bytes
    plain_act = plain.component("activation_peak")
    assert plain_act is not None
    assert rel - (plain_act.high_bytes - plain_act.bytes) / plain_act.bytes > 0.49
    assert any("image path" in n for n in vlm.notes) and not any("image path" in n for n in plain.notes)


def test_a_component_whose_own_note_says_unknown_is_named_in_the_band_line() -> None:
    """SGLang's CUDA context is vLLM's figure (its note says unknown term): the KV band line says so."""
    spec = get_entry("llama-3.1-8b-instruct").spec()
    gpu = get_gpu("rtx-4090")
    p = make_plan(spec, gpu, EngineSettings(engine="sglang", engine_version="0.4.9", max_model_len=131072))
    assert p.estimate.extra["kv_band_widest"] == "cuda_context"
    assert "cuda_context" in p.estimate.extra["kv_unknown_terms"]
    line = next(x for x in render_plan(p, spec, gpu).splitlines() if x.startswith("KV band:"))
    assert line.endswith("most of its width comes from the cuda_context term (an unknown term: see its note)")


def test_memory_other_processes_hold_is_named_outside_the_band_until_it_is_given() -> None:
    """SGLang keeps back (1 - fraction) of the memory free at start-up, so 1 GiB held by another process lowers the
    pool by fraction x 1 GiB, not 1 GiB: the plan names the term while it is unknown and drops it once given."""
    spec = get_entry("llama-3.1-8b-instruct").spec()
    gpu = get_gpu("rtx-4090")
    settings = EngineSettings(
        engine="sglang", engine_version="0.4.9", max_model_len=32768, mem_fraction_static=0.85
    )
    bare = make_plan(spec, gpu, settings)
    held = make_plan(spec, gpu, settings.with_(other_processes_bytes=1 << 30))
    assert any("other processes" in t for t in bare.estimate.extra["kv_unbanded_terms"])
    assert "kv_unbanded_terms" not in held.estimate.extra
    drop = bare.estimate.kv_available_bytes - held.estimate.kv_available_bytes
    assert abs(drop - 0.85 * (1 << 30)) < 2 << 20
    text = render_plan(bare, spec, gpu)
    assert "  not in the band: memory other processes hold on the card" in text
    assert "not in the band" not in render_plan(held, spec, gpu)


def test_vllm_names_what_other_processes_do_while_it_profiles_even_when_their_memory_is_given() -> None:
    spec = get_entry("llama-3.1-8b-instruct").spec()
    est = estimate(
        spec, H100, EngineSettings(engine_version="0.19.0", max_model_len=8192, other_processes_bytes=2 << 30)
    )
    assert any("while vLLM profiles" in t for t in est.extra["kv_unbanded_terms"])
    # llama.cpp sizes its buffers from the model and the context alone: nothing is named
    gguf = estimate(spec, H100, EngineSettings(engine="llama.cpp", ctx_size=4096))
    assert "kv_unbanded_terms" not in gguf.extra and "kv_unknown_terms" not in gguf.extra


def test_vllm_v1_before_the_snapshot_takes_what_other_processes_hold_off_the_pool() -> None:
    """V1 0.8.x-0.9.0 charges every non-torch byte on the card to the budget (other processes' too); 0.9.1's
    start-up snapshot and V0's baseline leave them out (they only have to leave util x total free)."""
    spec = get_entry("llama-3.1-8b-instruct").spec()
    drops = {}
    for version, mode in (("0.8.5", "v1"), ("0.9.2", "v1"), ("0.8.5", "v0")):
        settings = EngineSettings(engine_version=version, vllm_engine=mode, max_model_len=8192)
        bare = estimate(spec, H100, settings)
        held = estimate(spec, H100, settings.with_(other_processes_bytes=2 << 30))
        drops[(version, mode)] = bare.kv_available_bytes - held.kv_available_bytes
    assert drops[("0.8.5", "v1")] == 2 << 30
    assert drops[("0.9.2", "v1")] == 0 and drops[("0.8.5", "v0")] == 0
