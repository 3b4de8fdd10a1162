"""Weight bytes the engine loads: bitsandbytes skip lists and statistics by vLLM era, scaled RoPE caches.

Every expected figure is a "Model loading took" / "model weights take" line of a public log (the rows of
benchmarks/data/observed_memory.jsonl named beside it), never the formula recomputed.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from capacity_models import GEMMA3_4B, QWEN3_8B, part, spec
from vramlab.capacity import GIB, EngineSettings, estimate, get_gpu
from vramlab.capacity.weights import (
    effective_quant,
    is_layer_skipped_bnb,
    lora_slot_params,
    rope_cache_elems,
    weight_bytes,
)
from vramlab.sources.catalog import load_catalog
from vramlab.sources.hf_config import spec_from_config

CATALOG = load_catalog()

# The bitsandbytes config Unsloth 2025.8.4 passed to vLLM 0.10.0 for
# unsloth/qwen2.5-0.5b-instruct-unsloth-bnb-4bit, as printed in the r203 log
# ("Unsloth: vLLM Bitsandbytes config using kwargs = {...}", find_string file id 33404547317).
UNSLOTH_DYNAMIC_QC: dict[str, Any] = {
    "quant_method": "bitsandbytes",
    "load_in_8bit": False,
    "load_in_4bit": True,
    "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_quant_storage": "uint8",
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False,
    "llm_int8_skip_modules": [
        "lm_head",
        "multi_modal_projector",
        "merger",
        "modality_projection",
        "model.layers.0.self_attn",
        "model.layers.0.mlp",
        "model.layers.2.mlp",
        "model.layers.3.mlp",
        "model.layers.21.mlp",
        "model.layers.0.self_attn.q_proj",
    ],
    "llm_int8_threshold": 6.0,
}


def _qwen05_unsloth(skip: bool = True):
    cfg = copy.deepcopy(CATALOG.get("qwen2.5-0.5b-instruct").config)
    qc = dict(UNSLOTH_DYNAMIC_QC)
    if not skip:
        qc["llm_int8_skip_modules"] = None
    cfg["quantization_config"] = qc
    return spec_from_config(cfg, "unsloth/qwen2.5-0.5b-instruct-unsloth-bnb-4bit", "test")


def _loaded_gib(m, version: str, gpu: str = "rtx-3090") -> float:
    s = EngineSettings(
        engine_version=version, quantization="bitsandbytes", gpu_memory_utilization=0.78, max_model_len=4096
    )
    return estimate(m, get_gpu(gpu), s).weights_bytes / GIB


def test_skip_matcher_is_vllms_component_or_prefix_match():
    # vllm/model_executor/layers/quantization/bitsandbytes.py is_layer_skipped_bnb (0.10-0.29).
    skip = tuple(UNSLOTH_DYNAMIC_QC["llm_int8_skip_modules"])
    assert is_layer_skipped_bnb("model.layers.0.self_attn.qkv_proj", skip)  # dotted prefix
    assert is_layer_skipped_bnb("model.layers.21.mlp.down_proj", skip)
    assert is_layer_skipped_bnb("visual.merger.mlp.0", skip)  # a component equal to an entry
    assert not is_layer_skipped_bnb("model.layers.1.mlp.gate_up_proj", skip)
    assert not is_layer_skipped_bnb("model.layers.2.self_attn.qkv_proj", skip)
    # a leaf name never matches vLLM's fused module (unsloth#1886): q_proj alone skips nothing
    assert not is_layer_skipped_bnb("model.layers.5.self_attn.qkv_proj", ("model.layers.5.self_attn.q_proj",))
    assert not is_layer_skipped_bnb("model.layers.0.mlp.gate_up_proj", ())


def test_config_reader_keeps_the_skip_list_and_double_quant():
    q = _qwen05_unsloth().quant
    assert q is not None and q.method == "bitsandbytes" and q.bits == 4
    assert q.double_quant and "model.layers.21.mlp" in q.skip_modules
    # vLLM BitsAndBytesConfig.from_config: double quant defaults to False, the skip list to [].
    bare = spec_from_config(
        {
            **CATALOG.get("qwen2.5-0.5b-instruct").config,
            "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True},
        },
        "x",
        "test",
    )
    assert bare.quant is not None and not bare.quant.double_quant and bare.quant.skip_modules == ()
    # in-flight quantization (--quantization bitsandbytes on a 16-bit checkpoint) compresses the statistics:
    # BitsAndBytesModelLoader._unquantized_generator calls quantize_4bit(..., compress_statistics=True)
    inflight = effective_quant(CATALOG.get("qwen2.5-0.5b-instruct").spec(), "bitsandbytes")
    assert inflight is not None and inflight.double_quant and inflight.skip_modules == ()


def test_unsloth_dynamic_checkpoint_keeps_skipped_modules_in_16_bit():
    # r203 (vLLM 0.10.0, RTX 3090): "Model loading took 0.5151 GiB"; planned all-4-bit it was 0.43 (-17 %).
    with_skip = _loaded_gib(_qwen05_unsloth(), "0.10.0")
    assert with_skip == pytest.approx(0.5151, rel=0.015)
    without = _loaded_gib(_qwen05_unsloth(skip=False), "0.10.0")
    assert without < 0.5151 * 0.9


def test_bnb_statistics_follow_the_vllm_era():
    # unsloth/phi-4-bnb-4bit (double quant) on vLLM 0.7.1: "Loading model weights took 8.4920 GB" (r073, a
    # GiB figure). Before 0.9.2 the uint8 absmax stays nested; 0.9.2 expands it to fp32 at load
    # (PR #19742, dequantize_dq): 3/64 byte more per 4-bit weight, ~0.6 GiB on Phi-4's 13.6B linear params.
    phi = CATALOG.get("phi-4-bnb-4bit").spec()
    assert phi.quant is not None and phi.quant.double_quant
    old = _loaded_gib(phi, "0.7.1", "t4")
    assert old == pytest.approx(8.492, rel=0.01)
    new = _loaded_gib(phi, "0.10.0", "t4")
    assert 0.5 < new - old < 0.7
    assert _loaded_gib(phi, "0.9.1", "t4") == pytest.approx(old)
    assert _loaded_gib(phi, "0.9.2", "t4") == pytest.approx(new)
    # without double quantization the statistics are fp32 in every era
    plain = phi.with_(quant=dataclasses.replace(phi.quant, double_quant=False))
    assert _loaded_gib(plain, "0.7.1", "t4") == pytest.approx(new)


def test_linear_rope_scaling_caches_the_scaled_length_and_gemma3_a_local_one():
    # Gemma 3 4B: global layers' RoPE is linear x8 over 131072 positions, sliding layers an unscaled one
    # (vllm gemma3.py Gemma3Attention; rotary_embedding LinearScalingRotaryEmbedding max_len = max_pos x factor).
    g = spec(
        {
            **GEMMA3_4B,
            "text_config": {
                **GEMMA3_4B["text_config"],
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            },
        }
    )
    assert rope_cache_elems(g) == 131072 * 256 * (8 + 1)
    unscaled = spec(GEMMA3_4B)
    assert rope_cache_elems(unscaled) == 131072 * 256
    with_cache, _ = weight_bytes(g)
    without, _ = weight_bytes(g, rope_cache=False)
    assert (with_cache - without) / GIB == pytest.approx(131072 * 256 * 9 * 2 / GIB)


def test_gemma3_4b_weights_match_the_v019_log():
    # r011, vLLM 0.19.0 on an H100: "Model loading took 8.58 GiB" (the RoPE caches were 0.5 GiB short).
    m = CATALOG.get("gemma-3-4b-it").spec()
    est = estimate(
        m,
        get_gpu("h100-80gb"),
        EngineSettings(engine_version="0.19.0", gpu_memory_utilization=0.95, max_model_len=8192),
    )
    assert est.weights_bytes / GIB == pytest.approx(8.58, rel=0.01)


def test_lora_slots_count_as_weights_like_the_loading_line():
    # r066, vLLM 0.10.2 V1 on an L4, unsloth/Qwen3-8B-FP8 with 'enable_lora': True, 'max_lora_rank': 32:
    # "Model loading took 8.9638 GiB". Without the slots the plan was 8.80 (-1.8 %).
    s = EngineSettings(
        engine_version="0.10.2", quantization="fp8", gpu_memory_utilization=0.8, max_model_len=2048
    )
    qwen3_8b = spec(QWEN3_8B)
    plain = estimate(qwen3_8b, get_gpu("l4"), s).weights_bytes / GIB
    lora = estimate(qwen3_8b, get_gpu("l4"), s.with_(enable_lora=True, max_lora_rank=32))
    assert lora.weights_bytes / GIB == pytest.approx(8.9638, rel=0.01)
    assert plain < 8.9638 * 0.985
    assert "LoRA slots" in next(c.note for c in lora.components if c.name == "weights")
    # r077, vLLM 0.16.1 on a B200, unsloth/Qwen3-4B bf16, max_lora_rank 64: "Model loading took 7.80 GiB".
    q4 = CATALOG.get("qwen3-4b").spec()
    s4 = EngineSettings(
        engine_version="0.16.1",
        gpu_memory_utilization=0.8,
        max_model_len=2048,
        enable_lora=True,
        max_lora_rank=64,
    )
    assert estimate(q4, get_gpu("b200"), s4).weights_bytes / GIB == pytest.approx(7.80, rel=0.01)
    # the slots scale with max_loras and split with TP (vLLM shards B of column-parallel, A of row-parallel)
    one = lora_slot_params(qwen3_8b, max_lora_rank=32)
    assert lora_slot_params(qwen3_8b, max_lora_rank=32, max_loras=4) == 4 * one
    assert one / 2 < lora_slot_params(qwen3_8b, tp=2, max_lora_rank=32) < one
    # other engines do not allocate vLLM's slots
    sg = EngineSettings(engine="sglang", quantization="fp8", enable_lora=True, max_lora_rank=32)
    assert (
        estimate(qwen3_8b, get_gpu("l4"), sg).weights_bytes
        == estimate(qwen3_8b, get_gpu("l4"), sg.with_(enable_lora=False)).weights_bytes
    )


def test_qwen25_vl_tower_includes_its_patch_merger():
    # Qwen2.5-VL-7B-Instruct has 8.29B parameters, Qwen2.5-7B-Instruct 7.62B (their model cards): the tower
    # and its PatchMerger (5120 -> 5120 -> 3584) are ~0.68B. Without the merger the count was 0.630B.
    vl = CATALOG.get("qwen2.5-vl-7b-instruct").spec()
    assert vl.vision_params / 1e9 == pytest.approx(8.29 - 7.62, rel=0.02)
    # r070, vLLM 0.9.2 on a T4, unsloth/qwen2.5-vl-7b-instruct-unsloth-bnb-4bit in fp16:
    # "Model loading took 6.7940 GiB" (tower unquantized; the checkpoint's skip list is not public here).
    s = EngineSettings(
        engine_version="0.9.2",
        quantization="bitsandbytes",
        dtype="float16",
        gpu_memory_utilization=0.77,
        max_model_len=16384,
        max_num_seqs=1,
    )
    assert estimate(vl, get_gpu("t4"), s).weights_bytes / GIB == pytest.approx(6.794, rel=0.02)


def test_benchmark_keeps_a_bnb_row_on_bitsandbytes():
    # A "...-bnb-4bit" checkpoint name is bitsandbytes storage when the log says quantization=bitsandbytes,
    # not a compressed-tensors w4a16 scheme (the benchmark planned r068/r070/r076 as w4a16 before).
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from accuracy import quant_from_row

    m = CATALOG.get("qwen2.5-7b-instruct").spec()
    row = {"quantization": "bitsandbytes", "model": "unsloth/qwen2.5-vl-7b-instruct-unsloth-bnb-4bit"}
    assert quant_from_row(row, m) == "bitsandbytes"
    assert quant_from_row({"quantization": "compressed-tensors", "model": "x/Llama-W4A16"}, m) == "w4a16"


def test_unsloth_dynamic_llama_keeps_layer_1_mlp_in_16_bit():
    # r072, vLLM 0.7.3 on a T4 (fp16): Unsloth printed the checkpoint's skip list
    # ['lm_head', ..., 'model.layers.1.mlp'] and "Loading model weights took 5.5976 GB" (a GiB figure). In
    # 0.7.x the LoRA slots are created after that line (its log prints PunicaWrapperGPU afterwards), so the
    # comparison is without them. The plain bnb-4bit checkpoint (no skip list) is 0.24 GiB lighter.
    dyn = CATALOG.get("unsloth/meta-llama-3.1-8b-instruct-unsloth-bnb-4bit").spec()
    assert dyn.quant is not None and "model.layers.1.mlp" in dyn.quant.skip_modules
    s = EngineSettings(
        engine_version="0.7.3",
        quantization="bitsandbytes",
        dtype="float16",
        gpu_memory_utilization=0.59,
        max_model_len=1024,
    )
    assert estimate(dyn, get_gpu("t4"), s).weights_bytes / GIB == pytest.approx(5.5976, rel=0.01)
    # the notebook's rank-32 LoRA (lora_rank = 32) does not enter 0.7.x's weights line; from 0.8 it does
    lora = s.with_(enable_lora=True, max_lora_rank=32)
    assert estimate(dyn, get_gpu("t4"), lora).weights_bytes == estimate(dyn, get_gpu("t4"), s).weights_bytes
    assert (
        estimate(dyn, get_gpu("t4"), lora.with_(engine_version="0.8.5")).weights_bytes
        > estimate(dyn, get_gpu("t4"), s.with_(engine_version="0.8.5")).weights_bytes + 0.15 * GIB
    )
    plain = CATALOG.get("llama-3.1-8b-instruct-bnb-4bit").spec()
    assert plain.quant is not None and plain.quant.skip_modules == ()
    assert (
        0.2
        < (estimate(dyn, get_gpu("t4"), s).weights_bytes - estimate(plain, get_gpu("t4"), s).weights_bytes)
        / GIB
        < 0.3
    )


# --- MXFP4 experts as vLLM's MoE backend pads them (quantization/mxfp4.py create_weights) ---------------------------


def test_mxfp4_padding_per_backend_layout():
    from vramlab.capacity.mxfp4 import mxfp4_padding
    from vramlab.sources.catalog import get_entry

    oss = get_entry("gpt-oss-120b").spec()  # hidden 2880, expert width 2880
    assert mxfp4_padding(oss, 1, "marlin") == pytest.approx(3072 * 2944 / (2880 * 2880))
    assert mxfp4_padding(oss, 1, "flashinfer") == pytest.approx(3072 * 3072 / (2880 * 2880))
    assert mxfp4_padding(oss, 1, "triton") == pytest.approx(1.0)
    # at TP 4 (720 per rank) Marlin's 128 and FlashInfer's 256 both give 768
    assert mxfp4_padding(oss, 4, "marlin") == mxfp4_padding(oss, 4, "flashinfer")


def test_gpt_oss_120b_on_hopper_is_stored_in_marlins_layout_and_the_band_reaches_triton():
    """vLLM 0.10.1, one H100: the start-up logged 65.97 GiB of weights; Marlin's padding (128 / 256) plans them,
    the FlashInfer padding (256 / 256) planned 68.5 GiB."""
    from vramlab.capacity import EngineSettings, estimate, get_gpu
    from vramlab.sources.catalog import get_entry

    oss = get_entry("gpt-oss-120b").spec()
    hopper = estimate(oss, get_gpu("h100-80gb"), EngineSettings(engine_version="0.10.1", max_model_len=8192))
    w = hopper.component("weights")
    assert w is not None
    assert abs(w.bytes / GIB - 65.97) / 65.97 < 0.01
    assert "Triton kernels' layout if triton_kernels is installed" in w.note
    assert w.low_bytes < 0.95 * w.bytes  # the unpadded Triton layout is inside the band
    blackwell = estimate(oss, get_gpu("b200"), EngineSettings(engine_version="0.10.1", max_model_len=8192))
    assert part(blackwell, "weights").bytes > w.bytes  # FlashInfer's 256 / 256
    ampere = estimate(oss, get_gpu("a100-80gb"), EngineSettings(engine_version="0.10.1", max_model_len=8192))
    assert part(ampere, "weights").bytes == w.bytes and "Triton" not in part(ampere, "weights").note
