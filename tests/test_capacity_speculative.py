"""Speculative decoding in the plan (capacity/speculative*.py): the draft's weights and KV in vLLM, SGLang and
llama.cpp, by release. Expected figures are worked out by hand in the comments, from the shapes and the rules the
engines' source states (the module docstrings name the files and releases)."""

from __future__ import annotations

import pytest

from _narrow import some
from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.settings import Speculative
from vramlab.errors import ConfigError
from vramlab.sources import resolve_model
from vramlab.sources.hf_config import spec_from_config

MIB = 1 << 20
# An EAGLE-3 head for Llama-3.1-8B, with the tensors such a checkpoint ships (fc 4096 x 12288, midlayer q_proj
# reading 8192 inputs, lm_head 32000 x 4096, d2t int64[32000]).
EAGLE3_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 1,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# q/o 2 x 4096 x 4096 = 33,554,432; k/v 2 x 4096 x 1024 = 8,388,608; MLP 3 x 4096 x 14336 = 176,160,768; norms
# (input, post-attention, final) 3 x 4096 = 12,288: 218,116,096. The first layer's qkv reads [embeds, hidden]:
# + 4096 x (4096 + 2048) = 25,165,824; fc 3 x 4096 x 4096 = 50,331,648; lm_head 32000 x 4096 = 131,072,000;
# hidden_norm 4096. 424,689,664 params x 2 B + d2t 32000 x 8 B = 849,635,328 B (embedding: the target's).
EAGLE3_HEAD_BYTES = 849_635_328
# One layer, 8 KV heads x 128 x (K + V) x 2 B.
EAGLE3_KV_PER_TOKEN = 4096
LLAMA_8B_KV_PER_TOKEN = 131_072  # 32 layers x 8 x 128 x 2 x 2 B


@pytest.fixture(scope="module")
def llama():
    return resolve_model("llama-3.1-8b-instruct")


@pytest.fixture(scope="module")
def head():
    return spec_from_config(EAGLE3_HEAD, "eagle3-llama-3.1-8b", "test config")


H100 = get_gpu("h100-80gb")


def plan(model, settings):
    return estimate(model, H100, settings, with_suggestions=False)


# --- vLLM ------------------------------------------------------------------------------------------------------


def test_vllm_eagle3_head_weights_count_in_the_budget_and_its_layer_joins_the_pool(llama, head):
    base = EngineSettings(engine="vllm", max_model_len=8192)
    without = plan(llama, base)
    spec = plan(llama, base.with_(speculative=Speculative("eagle3", head, 3)))
    assert some(spec.component("draft_weights")).bytes == EAGLE3_HEAD_BYTES
    assert some(spec.component("draft_weights")).in_budget
    # the budget is the same: the pool gives up exactly the head's weights
    assert without.kv_cache_bytes - spec.kv_cache_bytes == EAGLE3_HEAD_BYTES
    # one pool, 32 + 1 layers of 4,096 B each: 135,168 B per token, blocks of 16 tokens
    assert spec.kv_bytes_per_token == LLAMA_8B_KV_PER_TOKEN + EAGLE3_KV_PER_TOKEN == 135_168
    assert spec.num_blocks == spec.kv_cache_bytes // (16 * 135_168)
    assert spec.kv_cache_tokens == spec.num_blocks * 16
    draft = spec.extra["speculative"]
    assert draft["draft_kv_in_pool"] and draft["draft_kv_bytes_per_token"] == EAGLE3_KV_PER_TOKEN
    assert draft["extra_slots"] == 3  # num_lookahead_tokens = num_speculative_tokens for EAGLE


def test_vllm_v0_leaves_the_draft_outside_the_profile(llama, head):
    base = EngineSettings(engine="vllm", vllm_engine="v0", max_model_len=8192)
    without = plan(llama, base)
    spec = plan(llama, base.with_(speculative=Speculative("eagle3", head, 3)))
    draft = spec.component("draft_weights")
    assert not draft.in_budget  # vllm issue 9995: the profile sees the target alone
    assert spec.used_bytes - without.used_bytes == EAGLE3_HEAD_BYTES
    assert spec.headroom_bytes == without.headroom_bytes - EAGLE3_HEAD_BYTES


def test_vllm_mtp_uses_the_models_own_layer_and_shares_embedding_and_head():
    # A dense model with one MTP layer: hidden 1024, 16 heads / 8 KV heads of 64, MLP 4096, vocab 32000.
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_hidden_layers": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 1,
    }
    model = spec_from_config(config, "mtp-test", "test config")
    assert model.mtp_layers == 1
    spec = plan(model, EngineSettings(engine="vllm", max_model_len=4096, speculative=Speculative("mtp")))
    # q/o 2 x 1024 x 1024 + k/v 2 x 1024 x 512 = 3,145,728; MLP 3 x 1024 x 4096 = 12,582,912; two norms and the
    # final one 3,072; eh_proj 2 x 1024 x 1024 = 2,097,152 and enorm / hnorm / shared_head norm 3,072:
    # 17,831,936 params x 2 B = 35,663,872 B
    assert some(spec.component("draft_weights")).bytes == 35_663_872
    # the MTP layer's KV: 8 x 64 x 2 x 2 B = 2,048 B a token beside the model's 4 x 2,048
    assert spec.kv_bytes_per_token == 5 * 2048
    assert spec.extra["speculative"]["num_speculative_tokens"] == 1  # defaults to the MTP layers


def test_mtp_without_mtp_layers_is_refused(llama):
    with pytest.raises(ConfigError, match="no multi-token-prediction layers"):
        plan(llama, EngineSettings(engine="vllm", speculative=Speculative("mtp")))


def test_glm45_mtp_layer_is_loaded_only_as_a_draft():
    glm = resolve_model("glm-4.5")
    base = EngineSettings(engine="vllm", tensor_parallel_size=8, max_model_len=32768)
    without = estimate(glm, get_gpu("h200"), base, with_suggestions=False)
    spec = estimate(
        glm, get_gpu("h200"), base.with_(speculative=Speculative("mtp", None, 1)), with_suggestions=False
    )
    assert without.weights_bytes == spec.weights_bytes  # the model's own weights line does not change
    # one MoE layer per GPU at TP 8: 160 experts x 3 x 5120 x 1536 / 8 = 471,859,200 params is most of it
    assert 471_859_200 * 2 < some(spec.component("draft_weights")).bytes < 1.2 * 471_859_200 * 2
    assert spec.kv_bytes_per_token - without.kv_bytes_per_token == 512  # 1 layer x 1 KV head x 128 x 2 x 2 B


# --- SGLang ----------------------------------------------------------------------------------------------------


def sglang(version: str, spec: Speculative | None = None) -> EngineSettings:
    return EngineSettings(engine="sglang", engine_version=version, max_model_len=8192, speculative=spec)


def test_sglang_056_draft_out_of_the_reserve_with_the_slot_headroom(llama, head):
    without = plan(llama, sglang("0.5.6"))
    spec = plan(llama, sglang("0.5.6", Speculative("eagle3", head)))
    # H100 79.19 GiB, 0.5.3+ heuristic: 512 + 8192 x 1.5 + 256 x 2 + 1/8 x 1024 = 13,440 MiB = 13.125 GiB;
    # (79.19 - 13.125) / 79.19 = 0.834; with EAGLE's 2 GiB (0.5.3-0.5.9): (79.19 - 15.125) / 79.19 = 0.809
    assert without.settings["mem_fraction_static"] == 0.834
    assert spec.settings["mem_fraction_static"] == 0.809
    assert spec.settings["max_running_requests"] == 48  # SGLang's default with speculative decoding
    # Llama: (5 steps, top-4, 8 draft tokens); 48 x (5 x 4 + 8) + 100 = 1,444 more tokens in both pools
    assert spec.extra["speculative"]["extra_slots"] == 1444
    assert some(spec.component("speculative_slots")).bytes == 1444 * LLAMA_8B_KV_PER_TOKEN
    assert (
        not some(spec.component("draft_weights")).in_budget and not some(spec.component("draft_kv")).in_budget
    )
    assert some(spec.component("draft_weights")).bytes == EAGLE3_HEAD_BYTES
    assert some(spec.component("draft_kv")).bytes == spec.kv_cache_tokens * EAGLE3_KV_PER_TOKEN
    # the target's own pool: its profiled cells plus the headroom
    profiled = spec.kv_cache_bytes // LLAMA_8B_KV_PER_TOKEN
    assert spec.kv_cache_tokens == profiled + 1444


def test_sglang_059_drops_the_headroom_and_0510_reserves_4_gib(llama, head):
    s059 = plan(llama, sglang("0.5.9", Speculative("eagle3", head)))
    assert s059.component("speculative_slots") is None and s059.extra["speculative"]["extra_slots"] == 0
    assert some(s059.component("draft_kv")).bytes == s059.kv_cache_tokens * EAGLE3_KV_PER_TOKEN
    s0510 = plan(llama, sglang("0.5.10", Speculative("eagle3", head)))
    # (79.19 - 13.125 - 4) / 79.19 = 0.7838 -> 0.784
    assert s0510.settings["mem_fraction_static"] == 0.784
    standalone = plan(
        llama, sglang("0.5.10", Speculative("draft_model", resolve_model("llama-3.2-1b-instruct")))
    )
    # STANDALONE keeps 6 GiB: (79.19 - 19.125) / 79.19 = 0.7585 -> 0.758
    assert standalone.settings["mem_fraction_static"] == 0.758


def test_sglang_0514_counts_the_draft_in_the_budget_and_sizes_one_cell(llama, head):
    without = plan(llama, sglang("0.5.14"))
    spec = plan(llama, sglang("0.5.14", Speculative("eagle3", head)))
    assert spec.settings["mem_fraction_static"] == 0.834  # no reserve: the draft is inside the fraction
    assert some(spec.component("draft_weights")).in_budget
    assert without.kv_cache_bytes - spec.kv_cache_bytes == EAGLE3_HEAD_BYTES
    # cell 131,072 x (1 + 1/32) = 135,168 B for the target's and the draft's pools together
    assert spec.kv_cache_tokens == spec.kv_cache_bytes // 135_168
    assert spec.extra["speculative"]["draft_kv_bytes"] == spec.kv_cache_tokens * EAGLE3_KV_PER_TOKEN


def test_sglang_reserve_refusal_names_the_draft(llama):
    # a whole 8B model as the STANDALONE draft of an 8B model on a 24 GB card: the reserve cannot hold it
    spec = estimate(
        resolve_model("qwen3-4b"),
        get_gpu("rtx-4090"),
        sglang("0.5.6", Speculative("draft_model", resolve_model("qwen3-8b"))).with_(max_model_len=4096),
        with_suggestions=False,
    )
    assert not spec.fits
    assert any("the draft's weights and KV" in r and "--mem-fraction-static" in r for r in spec.reasons)


# --- llama.cpp -------------------------------------------------------------------------------------------------


def test_llamacpp_draft_context_matches_a_published_b5142_log():
    """ggml-org/llama.cpp issue 12968 (build 5142): `llama-server -c 512 -cd 512 -m qwen2.5-72b-iq4xs.gguf -md
    qwen2.5-0.5b-iq4xs.gguf -ngld 999 -fa -ctk q8_0 -ctv q8_0`; the slot's draft context logs `KV buffer size = 6.00
    MiB` (type_k 'f16', n_layer 24) and `compute buffer size = 298.50 MiB`."""
    settings = EngineSettings(
        engine="llama.cpp",
        engine_version="b5142",
        ctx_size=512,
        quantization="IQ4_XS",
        flash_attn=True,
        kv_cache_dtype="q8_0",
        speculative=Speculative(
            "draft_model",
            resolve_model("qwen2.5-0.5b-instruct"),
            3,
            draft_n_gpu_layers=999,
            draft_ctx_size=512,
        ),
    )
    e = estimate(resolve_model("qwen2.5-72b-instruct"), get_gpu("mi300x"), settings, with_suggestions=False)
    # 512 cells x 24 layers x 2 KV heads x 64 x (K + V) x 2 B (f16: the draft's default) = 6 MiB
    assert some(e.component("draft_kv")).bytes == 6 * MIB
    # output phase: 4 B x (512 logit rows x 151,936 + 512 x 896) = 298.50 MiB, + the 1 MiB scratch constant
    assert abs(some(e.component("draft_compute")).bytes - 298.50 * MIB) <= 1 * MIB
    assert e.settings["parallel"] == 1


def test_llamacpp_one_draft_context_per_slot_until_the_shared_context():
    target, draft = resolve_model("qwen3-8b"), resolve_model("qwen3-0.6b")
    base = EngineSettings(engine="llama.cpp", quantization="Q4_K_M", ctx_size=32768, parallel=4)
    spec = Speculative("draft_model", draft, draft_ctx_size=4096)
    per_slot = estimate(target, get_gpu("rtx-4090"), base.with_(engine_version="b7500", speculative=spec))
    shared = estimate(target, get_gpu("rtx-4090"), base.with_(engine_version="b9300", speculative=spec))
    # qwen3-0.6b: 28 layers x 8 KV heads x 128 x (K + V) x 2 B = 114,688 B a cell
    assert some(per_slot.component("draft_kv")).bytes == 4 * 4096 * 114_688  # 4 slots x -cd 4096
    assert (
        some(shared.component("draft_kv")).bytes == 32768 * 114_688
    )  # the target's cells; -cd no longer applies
    # every per-slot context has its own compute buffer
    one = estimate(
        target, get_gpu("rtx-4090"), base.with_(engine_version="b7500", parallel=1, speculative=spec)
    )
    assert some(per_slot.component("draft_compute")).bytes == 4 * some(one.component("draft_compute")).bytes
    assert per_slot.extra["devices"][0]["draft_buffers_bytes"] == sum(
        some(per_slot.component(n)).bytes for n in ("draft_weights", "draft_kv", "draft_compute")
    )


def test_llamacpp_default_slots_with_a_draft_by_build():
    target, draft = resolve_model("qwen3-8b"), resolve_model("qwen3-0.6b")
    base = EngineSettings(engine="llama.cpp", quantization="Q4_K_M", ctx_size=16384)
    spec = Speculative("draft_model", draft)
    one_slot = estimate(target, get_gpu("rtx-4090"), base.with_(engine_version="b7500", speculative=spec))
    assert one_slot.settings["parallel"] == 1  # PR #17017: no extra slots (and draft contexts) by default
    four = estimate(target, get_gpu("rtx-4090"), base.with_(engine_version="b9300", speculative=spec))
    assert four.settings["parallel"] == 4 and four.settings["kv_unified"]


def test_llamacpp_refuses_what_it_does_not_plan(llama, head):
    with pytest.raises(ConfigError, match="llama.cpp"):
        plan(llama, EngineSettings(engine="llama.cpp", speculative=Speculative("eagle3", head)))
    with pytest.raises(ConfigError, match="vLLM, SGLang and llama.cpp"):
        plan(llama, EngineSettings(engine="tgi", speculative=Speculative("ngram")))
