"""Models people deploy in 2025-26: GLM-4.5 / 4.6 / 4.5-Air, Kimi-K2 and a ModelOpt NVFP4
checkpoint, planned on 8 H200s with vLLM. Every expected weights figure is derived by hand below from the
config's numbers (one TP rank of 8, bf16 = 2 bytes), following what vLLM's loader keeps:

- vllm/model_executor/models/glm4_moe.py: `first_k_dense_replace` dense MLPs, then MoE layers of routed experts
  plus a shared expert `moe_intermediate_size x n_shared_experts` wide; the router `nn.Linear(..., dtype=float32)`
  and its fp32 `e_score_correction_bias`, replicated; qkv bias; RoPE on `partial_rotary_factor` 0.5 of head_dim;
  the MTP layer (`num_nextn_predict_layers`, stored after the last layer) skipped (`skip_spec_layers`).
- vllm/model_executor/models/deepseek_v2.py (Kimi-K2 loads as DeepseekV3ForCausalLM): MLA with q_a / kv_a
  replicated, q_b / kv_b / o split by TP; the fp8 checkpoint's `weight_scale_inv` is one fp32 per 128x128 block.
- vllm/model_executor/layers/quantization/modelopt.py `ModelOptNvFp4LinearMethod.create_weights`: `weight` uint8
  (out, in / 2) and `weight_scale` fp8 (out, in / 16), i.e. 0.5 + 1/16 bytes a weight; `exclude_modules` stay bf16.

Left out on purpose (each < 0.001 % of these totals): qk-norm weights (2 x 128 a layer), per-shard fp32 global
scales, the ceil of 128-blocks over widths that are not multiples of 128, MLA's fp32 correction bias.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capacity_models import part
from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.weights import is_layer_excluded_modelopt, weight_bytes
from vramlab.sources.catalog import get_entry
from vramlab.sources.hf_config import spec_from_config
from vramlab.sources.resolve import spec_from_path

H200 = get_gpu("h200")
TP8 = EngineSettings(tensor_parallel_size=8, max_model_len=8192)


def _planned_weights(name: str) -> int:
    return part(estimate(get_entry(name).spec(), H200, TP8), "weights").bytes


# GLM-4.5, one rank of TP 8: hidden 5120, 92 layers, 96 heads / 8 KV heads of 128, 3 dense + 89 MoE layers.
#   attention / layer: q 96*128/8 = 1536, kv 8/8 = 1 head = 128: 5120*1536*2 + 2*5120*128 = 17,039,360
#                      + qkv bias 1536 + 256 and two norms 2*5120 = 12,032 (bf16 "other")
#   dense MLP: 3*5120*12288/8 = 23,592,960 (x 3);   shared expert: 3*5120*1536/8 = 2,949,120 (x 89)
#   routed experts: 160 * 2,949,120 = 471,859,200 (x 89);   router fp32: 160*(5120 + 1) = 819,360 (x 89)
#   embedding = lm_head: 151552/8 * 5120 = 96,993,280;   final norm 5120
#   bf16 params: 92*17,039,360 + 3*23,592,960 + 89*2,949,120 + 89*471,859,200 + 92*12,032 + 5120
#                + 2*96,993,280 = 44,091,439,104 -> 88,182,878,208 bytes
#   fp32 router: 89*819,360*4 = 291,692,160;  RoPE cache: 131072 positions * 64 (0.5 * 128) * 2 = 16,777,216
GLM45_TP8 = 88_182_878_208 + 291_692_160 + 16_777_216  # 88,491,347,584
# GLM-4.6: the same weights, the RoPE cache over 202752 positions: 202752*64*2 = 25,952,256
GLM46_TP8 = 88_182_878_208 + 291_692_160 + 25_952_256  # 88,500,522,624
# GLM-4.5-Air: hidden 4096, 46 layers (1 dense + 45 MoE), 128 experts 1408 wide, dense MLP 10944.
#   attention 4096*1536*2 + 2*4096*128 = 13,631,488 (x 46) + other 1792 + 8192 = 9,984 (x 46)
#   dense 3*4096*10944/8 = 16,809,984; shared 3*4096*1408/8 = 2,162,688 (x 45); experts 128*2,162,688 (x 45)
#   embedding = lm_head 18944*4096 = 77,594,624;  final norm 4096
#   bf16: 46*13,631,488 + 16,809,984 + 45*2,162,688 + 45*276,824,064 + 46*9,984 + 4096 + 2*77,594,624
#         = 13,353,914,880 -> 26,707,829,760;  router 45*128*4097*4 = 94,394,880;  RoPE 131072*64*2 = 16,777,216
AIR_TP8 = 26_707_829_760 + 94_394_880 + 16_777_216  # 26,819,001,856
# Kimi-K2: hidden 7168, 61 layers (1 dense + 60 MoE), 64 heads -> 8 a rank, q_lora 1536, kv_lora 512, rope 64,
# nope 128, v 128; 384 experts 2048 wide + 1 shared; fp8 weights with an fp32 scale per 128x128 block.
#   MLA / layer: q_a 7168*1536 + q_b 1536*8*192 + kv_a 7168*576 + kv_b 512*8*256 + o 8*128*7168 = 25,886,720
#   dense 3*7168*18432/8 = 49,545,216; shared 3*7168*2048/8 = 5,505,024 (x 60); experts 384*5,505,024 (x 60)
#   fp8 params: 61*25,886,720 + 49,545,216 + 60*5,505,024 + 60*2,113,929,216 = 128,794,689,536
#     -> bytes x (1 + 4/16384) = 128,794,689,536 + 31,444,016 = 128,826,133,552
#   bf16: norms 61*(1536 + 512 + 7168) + router 60*384*7168 + final 7168 = 165,720,064;
#         embedding = lm_head 20480*7168 = 146,800,640 -> (165,720,064 + 293,601,280)*2 = 918,642,688
#   RoPE (yarn: 4096 * 32 = 131072 positions of 64) * 2 = 16,777,216
KIMI_K2_TP8 = 128_826_133_552 + 918_642_688 + 16_777_216  # 129,761,553,456
# Llama-3.3-70B NVFP4: 80 layers, hidden 8192, 64 / 8 heads of 128, MLP 28672, lm_head excluded (bf16).
#   quantized / layer: 8192*1024*2 + 2*8192*128 + 3*8192*28672/8 = 106,954,752 -> 80 layers 8,556,380,160
#     -> x (0.5 + 1/16) = 4,812,963,840
#   bf16: norms 80*2*8192 + 8192 = 1,318,912; embedding = lm_head 16032*8192 = 131,334,144
#     -> (1,318,912 + 262,668,288)*2 = 527,974,400;  RoPE (llama3: 131072 positions of 128) * 2 = 33,554,432
NVFP4_LINEAR = 8_556_380_160
LLAMA33_FP4_TP8 = 4_812_963_840 + 527_974_400 + 33_554_432  # 5,374,492,672


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("glm-4.5", GLM45_TP8),
        ("glm-4.6", GLM46_TP8),
        ("glm-4.5-air", AIR_TP8),
        ("kimi-k2-instruct", KIMI_K2_TP8),
        ("llama-3.3-70b-instruct-fp4", LLAMA33_FP4_TP8),
    ],
)
def test_new_catalog_models_plan_their_hand_derived_weights(name: str, want: int) -> None:
    assert _planned_weights(name) == want


def test_glm_mtp_layer_is_not_loaded_and_its_router_is_fp32() -> None:
    cfg = dict(get_entry("glm-4.5").config)
    spec = get_entry("glm-4.5").spec()
    assert spec.num_layers == 92 and spec.first_k_dense_layers == 3 and spec.fp32_router
    assert spec.partial_rotary_factor == 0.5
    del cfg["num_nextn_predict_layers"]  # the same config without the MTP layer plans the same bytes
    assert (
        weight_bytes(spec_from_config(cfg, "glm", "t"), tp=8)
        == weight_bytes(spec, tp=8)
        == (GLM45_TP8, "formula")
    )
    # the router in bf16 would be 89*160*5120*2 bytes smaller (plus the 89*160 fp32 bias)
    bf16_router = spec.with_(fp32_router=False)
    assert GLM45_TP8 - weight_bytes(bf16_router, tp=8)[0] == 89 * 160 * 5120 * 2 + 89 * 160 * 4


def test_nvfp4_weights_carry_an_fp8_scale_per_16() -> None:
    """The same checkpoint read from a directory with ModelOpt's hf_quant_config.json beside config.json plans the
    catalog's bytes; without its scales the quantized weights would be 1/16 byte each lighter."""
    spec = get_entry("llama-3.3-70b-instruct-fp4").spec()
    q = spec.quant
    assert q is not None and (q.method, q.bits, q.group_size, q.skip_modules) == (
        "nvfp4",
        4.0,
        16,
        ("lm_head",),
    )
    assert get_entry("llama-3.3-70b-instruct-fp4").quant_label == "nvfp4"
    unscaled = spec.with_(quant=q.__class__("nvfp4", 4.0, group_size=1 << 40, unquantized_dtype="bfloat16"))
    assert weight_bytes(spec, tp=8)[0] - weight_bytes(unscaled, tp=8)[0] == NVFP4_LINEAR // 16


def test_an_nvfp4_directory_reads_hf_quant_config_json(tmp_path: Path) -> None:
    entry = get_entry("llama-3.3-70b-instruct-fp4")
    cfg = {k: v for k, v in entry.config.items() if k != "quantization_config"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(entry.config["quantization_config"]))
    assert weight_bytes(spec_from_path(tmp_path), tp=8) == (LLAMA33_FP4_TP8, "formula")
    (tmp_path / "hf_quant_config.json").unlink()  # without it: a bf16 checkpoint
    assert spec_from_path(tmp_path).quant is None


def test_modelopt_exclusions_keep_those_layers_in_bf16(tmp_path: Path) -> None:
    """ModelOpt's matcher: a fused layer when all its shards are named, a substring, or a wildcard."""
    assert is_layer_excluded_modelopt("model.layers.3.self_attn.qkv_proj", ("*self_attn*",))
    assert is_layer_excluded_modelopt("model.layers.3.self_attn.qkv_proj", ("model.layers.3.self_attn",))
    both = ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")
    assert is_layer_excluded_modelopt("model.layers.0.mlp.gate_up_proj", both)
    assert not is_layer_excluded_modelopt("model.layers.0.mlp.gate_up_proj", both[:1])
    assert not is_layer_excluded_modelopt("model.layers.0.mlp.down_proj", ("lm_head",))
    entry = get_entry("llama-3.3-70b-instruct-fp4")
    flat = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "ignore": ["lm_head", "*self_attn*"],
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
    }
    (tmp_path / "config.json").write_text(json.dumps({**entry.config, "quantization_config": flat}))
    # attention 80*(8192*1024*2 + 2*8192*128) = 1,509,949,440 params at 2 bytes instead of 0.5625
    assert weight_bytes(spec_from_path(tmp_path), tp=8)[0] == LLAMA33_FP4_TP8 + 1_509_949_440 * 23 // 16


def test_models_search_lists_the_new_entries() -> None:
    exe = Path(sys.executable).with_name("vramlab")
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9"}
    for needle, names in (
        ("glm", {"glm-4.5", "glm-4.6", "glm-4.5-air"}),
        ("kimi-k2", {"kimi-k2-instruct"}),
        ("fp4", {"llama-3.3-70b-instruct-fp4"}),
    ):
        r = subprocess.run(
            [str(exe), "models", "--search", needle, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        assert names <= {row["name"] for row in json.loads(r.stdout)}
