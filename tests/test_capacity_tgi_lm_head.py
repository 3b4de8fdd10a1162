"""TGI's LM head at warm-up: Gemma's tied head held twice, and the shard's own logits beside the gathered ones
(engines/tgi.py; docs/capacity-model.md, TGI)."""

from __future__ import annotations

from typing import Any

from capacity_models import LLAMA_31_8B, LLAMA_32_3B, part, spec
from vramlab.capacity import EngineSettings, estimate, get_gpu

H100, L4 = get_gpu("h100-80gb"), get_gpu("l4")
GEMMA_2B: dict[str, Any] = {  # google/gemma-2b's config.json (as benchmarks/data/model_configs.json holds it)
    "architectures": ["GemmaForCausalLM"],
    "model_type": "gemma",
    "hidden_size": 2048,
    "intermediate_size": 16384,
    "num_attention_heads": 8,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}


def tgi(model: dict[str, Any], gpu: Any, version: str, **extra: Any) -> Any:
    settings = EngineSettings(
        engine="tgi", engine_version=version, max_model_len=2048, max_batch_prefill_tokens=4096, **extra
    )
    return estimate(spec(model), gpu, settings)


def test_gemma_tied_lm_head_is_a_second_copy_of_the_embedding():
    # flash_gemma_modeling.py (v1.4.3): the embedding is scaled in place and the LM head loaded again from
    # model.embed_tokens. One copy: 256,000 rows x 2,048 x 2 bytes (bf16) = 1,048,576,000 bytes.
    one = tgi(GEMMA_2B, L4, "2.0.0")
    assert part(one, "tied_lm_head").bytes == 1_048_576_000
    # Two shards: TensorParallelHead.load shards it by rows (256,000 / 2 = 128,000): 524,288,000 bytes a shard.
    assert part(tgi(GEMMA_2B, H100, "2.0.0", tensor_parallel_size=2), "tied_lm_head").bytes == 524_288_000
    # So the tied checkpoint takes what the same model untied takes: the untied weights count that head themselves.
    untied = tgi({**GEMMA_2B, "tie_word_embeddings": False}, L4, "2.0.0")
    assert untied.component("tied_lm_head") is None
    assert part(untied, "weights").bytes - part(one, "weights").bytes == 1_048_576_000
    assert untied.kv_cache_tokens == one.kv_cache_tokens


def test_only_gemma_is_known_to_hold_its_tied_head_twice():
    assert tgi(LLAMA_32_3B, L4, "2.0.0").component("tied_lm_head") is None


def test_tgi_2_4_holds_the_shard_logits_beside_the_gathered_ones():
    # layers/tensor_parallel.py (v2.4.0) TensorParallelHead.forward: gather_input (64,128 rows x 4,096 tokens) and
    # world_out (128,256 x 4,096) are both alive during all_gather_into_tensor; log_softmax is then in place.
    # (128,256 + 64,128) x 4,096 x 2 bytes = 1,576,009,728. One shard keeps 128,256 x 4,096 x 2 = 1,050,673,152.
    row = 128_256 * 2
    assert (
        part(tgi(LLAMA_31_8B, H100, "2.4.0", tensor_parallel_size=2), "warmup_logits").bytes == 1_576_009_728
    )
    assert part(tgi(LLAMA_31_8B, H100, "2.4.0"), "warmup_logits").bytes == 1_050_673_152
    # Before 2.4 logits + log_softmax (2 copies) already outweigh world_out + the shard (1.5): unchanged.
    assert (
        part(tgi(LLAMA_31_8B, H100, "2.2.0", tensor_parallel_size=2), "warmup_logits").bytes == 2 * 4096 * row
    )
    # From 3.0 only next-token rows: 3 requests (4,096 prefill tokens / 2,047 a request,
    # rounded up), one next-token row each.
    assert part(tgi(LLAMA_31_8B, H100, "3.3.6", tensor_parallel_size=2), "warmup_logits").bytes == 3 * row
