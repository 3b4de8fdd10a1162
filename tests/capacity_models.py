"""Small model configs for capacity tests, as they appear in the models' published config.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vramlab.capacity import estimate
from vramlab.capacity.estimate import Component, Estimate
from vramlab.sources.hf_config import spec_from_config

ROOT = Path(__file__).resolve().parents[1]
# The shipped rows of real start-ups (benchmarks/data), by row id, for tests that plan one as the benchmark does.
sys.path.insert(0, str(ROOT / "benchmarks"))
import accuracy  # noqa: E402  (benchmarks/accuracy.py: the rows as the benchmark reads them)

ROWS = {r["row_id"]: r for r in accuracy.load_rows(ROOT / "benchmarks" / "data" / "observed_memory.jsonl")}


def row_estimate(row_id: str):
    """The row planned exactly as `benchmarks/accuracy.py` plans it (model, card, settings from the log)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import accuracy

    row = ROWS[row_id]
    configs = json.loads((ROOT / "benchmarks" / "data" / "model_configs.json").read_text())
    model = accuracy.model_for(row, configs)
    assert not isinstance(model, str), model
    return row, estimate(
        model, accuracy.gpu_for(row), accuracy.scored_settings(row, accuracy.settings_for(row, model))
    )


LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
LLAMA_32_3B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_attention_heads": 24,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
    "head_dim": 128,
}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
PHI_4 = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "hidden_size": 5120,
    "intermediate_size": 17920,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "num_key_value_heads": 10,
    "vocab_size": 100352,
    "max_position_embeddings": 16384,
    "torch_dtype": "bfloat16",
}
# Kimi-VL: DeepSeek-V3-style MLA hidden inside text_config (planners miss it; llm-d anchor r038).
KIMI_VL = {
    "architectures": ["KimiVLForConditionalGeneration"],
    "model_type": "kimi_vl",
    "text_config": {
        "model_type": "deepseek_v3",
        "hidden_size": 2048,
        "intermediate_size": 11264,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 163840,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "n_routed_experts": 64,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 1408,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
    },
    "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27, "intermediate_size": 4304},
}
GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_attention_heads": 8,
        "num_hidden_layers": 34,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 262208,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
    },
    "torch_dtype": "bfloat16",
}
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 201088,
    "sliding_window": 128,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "quantization_config": {"quant_method": "mxfp4"},
    "torch_dtype": "bfloat16",
}
# A Mamba-2 / attention hybrid in the Nemotron-H style.
HYBRID = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hidden_size": 4096,
    "intermediate_size": 21504,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 14,
    "hybrid_override_pattern": "M-M-M*-M-M-M*-",
    "vocab_size": 131072,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


def spec(config: dict, name: str = "test-model"):
    return spec_from_config(config, name, "tests/capacity_models.py")


def part(est: Estimate, name: str) -> Component:
    """The estimate's component `name`; fails the test (not a None error later) when it is missing."""
    c = est.component(name)
    assert c is not None, f"no {name!r} component in {[x.name for x in est.components]}"
    return c
