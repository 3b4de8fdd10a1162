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
    est = estimate(spec, H100, EngineSettings(engine_version="0.10.1", max_model_len=8192), with_suggestions=False)
    low, high = est.extra["kv_band_bytes"]
    assert low < est.kv_available_bytes < 0 and est.kv_cache_bytes == 0


def test_plan_text_says_when_the_widest_term_is_an_unknown_one() -> None:
    spec = get_entry("gemma-3-27b-it").spec()
    p = make_plan(spec, H100, EngineSettings(engine_version="0.29.0"))
    text = render_plan(p, spec, H100)
    line = next(x for x in text.splitlines() if x.startswith("KV band:"))
    assert "most of its width comes from the activation_peak term (an unknown term: see its note)" in line
    assert any(n.startswith("unknown term, band widened (activation peak)") for n in p.estimate.notes)


def test_tgi_widens_a_vision_models_warm_up_and_says_so() -> None:
    gpu = get_gpu("a100-80gb")
    vlm = estimate(get_entry("gemma-3-27b-it").spec(), gpu, EngineSettings(engine="tgi", tensor_parallel_size=2))
    text = get_entry("llama-3.1-8b-instruct").spec()
    plain = estimate(text, gpu, EngineSettings(engine="tgi"))
    act = vlm.component("activation_peak")
    assert act is not None
    rel = (act.high_bytes - act.bytes) / act.bytes
    plain_act = plain.component("activation_peak")
    assert plain_act is not None
    assert rel - (plain_act.high_bytes - plain_act.bytes) / plain_act.bytes > 0.49
    assert any("image path" in n for n in vlm.notes) and not any("image path" in n for n in plain.notes)
