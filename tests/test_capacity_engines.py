"""SGLang, TGI, llama.cpp and transformers policies."""

from __future__ import annotations

from typing import Any

import pytest

from capacity_models import GEMMA3_4B, LLAMA_31_8B, QWEN3_8B, part, spec
from vramlab.capacity import GIB, Constants, EngineSettings, estimate, get_gpu
from vramlab.capacity.engines.common import Context
from vramlab.capacity.engines.sglang import default_fraction, gpu_defaults

H100, L4, RTX4090 = get_gpu("h100-80gb"), get_gpu("l4"), get_gpu("rtx-4090")
QWEN3_235B_FP8 = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 94,
    "vocab_size": 151936,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 1536,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}


def test_sglang_pool_matches_published_qwen3_235b():
    # vllm issue #21348: SGLang --mem-fraction-static 0.93, TP4 H100: #tokens 367,404, K size 8.23 GB (GiB).
    est = estimate(
        spec(QWEN3_235B_FP8),
        H100,
        EngineSettings(
            engine="sglang", tensor_parallel_size=4, mem_fraction_static=0.93, max_model_len=32768
        ),
    )
    assert est.kv_cache_tokens == pytest.approx(367_404, rel=0.05)
    assert est.kv_bytes_per_token == 94 * 1 * 128 * 2 * 2


def test_sglang_keeps_back_a_share_of_what_was_free_at_start_up_not_of_the_card():
    """model_runner passes min_per_gpu_memory (free after init_torch_distributed) as total_gpu_memory:
    memory another process already holds is not counted twice, the reserve shrinks with it."""
    m = spec(LLAMA_31_8B)
    alone = estimate(m, L4, EngineSettings(engine="sglang", mem_fraction_static=0.9, max_model_len=8192))
    shared = estimate(
        m,
        L4,
        EngineSettings(
            engine="sglang", mem_fraction_static=0.9, max_model_len=8192, other_processes_bytes=GIB
        ),
    )
    assert shared.kv_cache_bytes > 0
    assert alone.kv_cache_bytes - shared.kv_cache_bytes == pytest.approx(0.9 * GIB, abs=2)
    assert "free at start-up" in part(alone, "kv_cache").note


def test_sglang_default_fraction_heuristics():
    ctx = Context(
        spec(LLAMA_31_8B), H100, EngineSettings(engine="sglang", engine_version="0.5.6"), Constants.defaults()
    )
    chunk, bs = gpu_defaults(ctx)
    assert (chunk, bs) == (8192, 256)
    # 512 + 8192 x 1.5 + 256 x 2 + 1/8 x 1024 MiB = 13.125 GiB reserved on 79.19 GiB.
    assert default_fraction(ctx, chunk, bs) == round((79.19 - 13.125) / 79.19, 3)
    old = Context(
        spec(LLAMA_31_8B), H100, EngineSettings(engine="sglang", engine_version="0.4.8"), Constants.defaults()
    )
    assert default_fraction(old, chunk, bs) == round((79.19 - 10.0) / 79.19, 3)  # 9.5 + tp/2 (PR #7054)


@pytest.mark.parametrize(
    ("version", "tp", "fraction"),
    [
        ("0.4.3", 4, 0.85),  # r090: no --mem-fraction-static in the command, server_args printed 0.85 at TP 4
        ("0.4.3", 1, 0.88),
        ("0.4.6", 2, 0.87),
        ("0.4.6", 8, 0.81),
        ("0.3.0", 16, 0.79),
        ("0.1.13", 1, 0.90),
        ("0.1.13", 4, 0.82),
    ],
)
def test_sglang_default_fraction_before_pr_7054_follows_the_tp_size(version, tp, fraction):
    ctx = Context(
        spec(LLAMA_31_8B),
        L4,
        EngineSettings(engine="sglang", engine_version=version, tensor_parallel_size=tp),
        Constants.defaults(),
    )
    assert default_fraction(ctx, *gpu_defaults(ctx)) == fraction


def test_sglang_activation_beyond_the_reservation_does_not_fit():
    est = estimate(
        spec(LLAMA_31_8B), H100, EngineSettings(engine="sglang", mem_fraction_static=0.99, max_model_len=8192)
    )
    assert not est.fits and "mem_fraction_static" in est.reasons[0]


def test_tgi_keeps_ten_percent_of_the_card():
    m = spec(LLAMA_31_8B)
    est = estimate(m, H100, EngineSettings(engine="tgi", max_model_len=8192))
    non_kv = sum(c.bytes for c in est.components if c.in_budget and c.name != "kv_cache")
    assert est.kv_cache_bytes == pytest.approx(H100.memory_bytes * 0.9 - non_kv, abs=2)
    assert est.kv_cache_tokens == est.kv_cache_bytes // 131_072  # flashinfer blocks of one token


def test_tgi_warmup_logits_by_release():
    """The router warms up with prefill_logprobs: true. flash_causal_lm.py: to 2.3 logits + log_softmax of
    every prefill token, 2.4 log_softmax in place (one copy), 3.x drops prefill logprobs unless
    REQUEST_LOGPROBS is set (next-token rows only)."""
    m = spec(LLAMA_31_8B)
    row = 128_256 * 2  # one bf16 logit row

    def logits(version, prefill):
        est = estimate(
            m,
            H100,
            EngineSettings(
                engine="tgi", engine_version=version, max_model_len=8192, max_batch_prefill_tokens=prefill
            ),
        )
        return part(est, "warmup_logits").bytes, est.kv_cache_bytes

    (two_2k, kv_2k), (two_4k, kv_4k) = logits("2.2.0", 2048), logits("2.2.0", 4096)
    assert two_4k == 2 * two_2k == 2 * 4096 * row and kv_4k < kv_2k
    assert logits("2.4.0", 4096)[0] == 4096 * row
    assert logits("3.3.6", 4096)[0] == 1 * row  # one request of 4,096 tokens: its next-token row


A10G = get_gpu("a10g")


def test_tgi_2x_keeps_five_percent_of_the_free_memory_and_says_its_band_is_wide():
    m = spec(LLAMA_31_8B)
    settings: dict[str, Any] = dict(engine="tgi", max_model_len=4096, max_batch_prefill_tokens=4145)
    old = estimate(m, A10G, EngineSettings(engine_version="2.2.0", **settings))
    new = estimate(m, A10G, EngineSettings(engine_version="3.3.6", **settings))
    assert "95 %" in part(old, "kv_cache").note and "10 %" in part(new, "kv_cache").note
    assert any(n.startswith("unknown term, band widened") for n in old.notes)
    assert not any(n.startswith("unknown term") for n in new.notes)
    # TGI 2.2.0 on an A10G printed "Setting max batch total tokens to 19056" for this model and these
    # defaults (benchmarks/data r100): the widened band must hold it, the point estimate does not.
    assert old.pessimistic is not None and old.pessimistic.kv_cache_tokens <= 19056 < old.kv_cache_tokens


def test_llamacpp_kv_is_fixed_by_ctx_size_and_padded():
    m = spec(LLAMA_31_8B)
    est = estimate(m, RTX4090, EngineSettings(engine="llama.cpp", ctx_size=32768, parallel=4))
    # llama.cpp prints "KV self size = 4096.00 MiB" for an 8B Llama at n_ctx 32768 in f16.
    assert est.kv_cache_bytes == 4096 << 20
    assert est.max_concurrency == 4 and est.max_model_len == 8192
    odd = estimate(m, RTX4090, EngineSettings(engine="llama.cpp", ctx_size=1000))
    assert odd.kv_cache_bytes == 1024 * 131_072  # padded to 256 cells
    q8 = estimate(m, RTX4090, EngineSettings(engine="llama.cpp", ctx_size=32768, kv_cache_dtype="q8_0"))
    assert q8.kv_cache_bytes == pytest.approx(est.kv_cache_bytes * 34 / 64, rel=1e-6)


def test_llamacpp_sliding_layers_hold_the_window_only():
    g = spec(GEMMA3_4B)
    full = estimate(g, RTX4090, EngineSettings(engine="llama.cpp", ctx_size=32768))
    per_layer_token = 2 * 4 * 256 * 2
    # 5 global layers x 32768 cells + 29 sliding layers x pad(1024 + 512, 256) cells.
    assert full.kv_cache_bytes == per_layer_token * (5 * 32768 + 29 * 1536)


def test_llamacpp_out_of_memory_names_cudamalloc():
    est = estimate(
        spec(QWEN3_8B),
        L4,
        EngineSettings(engine="llama.cpp", ctx_size=40960, parallel=1, dtype="float32", n_gpu_layers=-1),
    )  # -ngl all: --fit leaves the layers where the user put them
    assert not est.fits and "cudaMalloc" in est.reasons[0]
    assert est.extra["fit"]["message"] == "n_gpu_layers already set by user to -2, abort"


def test_transformers_memory_grows_with_batch_times_length():
    m = spec(LLAMA_31_8B)
    one = estimate(m, H100, EngineSettings(engine="transformers", max_model_len=4096, max_num_seqs=1))
    four = estimate(m, H100, EngineSettings(engine="transformers", max_model_len=4096, max_num_seqs=4))
    assert four.kv_cache_bytes == 4 * one.kv_cache_bytes == 4 * 4096 * 131_072
    assert four.used_bytes > one.used_bytes
    # `transformers serve` without continuous batching answers one request at a time.
    assert one.max_concurrency == 1.0
    assert any("one request at a time" in n for n in one.notes)
    batched = estimate(
        m,
        H100,
        EngineSettings(engine="transformers", max_model_len=4096, max_num_seqs=1, continuous_batching=True),
    )
    # (79 - 15.5 GiB) / (0.5 GiB KV + ~0.6 GiB prefill activations) per 4k-token sequence
    assert 45 < batched.max_concurrency < 75


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "llama.cpp", "transformers"])
def test_every_engine_reports_the_contract_fields(engine):
    est = estimate(spec(QWEN3_8B), H100, EngineSettings(engine=engine, max_model_len=8192))
    j = est.to_json()
    for key in (
        "weights_bytes",
        "kv_cache_bytes",
        "kv_cache_tokens",
        "kv_bytes_per_token",
        "activation_peak_bytes",
        "non_torch_bytes",
        "cuda_graph_bytes",
        "headroom_bytes",
    ):
        assert isinstance(j[key], int), key
    assert isinstance(j["fits"], bool) and j["components"]
    if (
        engine == "llama.cpp"
    ):  # the untied input embedding (151,936 x 4,096 bf16 = 1.16 GiB) stays on the host
        assert j["weights_bytes"] / GIB == pytest.approx(15.27 - 1.16, rel=0.02)
    else:
        assert j["weights_bytes"] / GIB == pytest.approx(
            15.27, rel=0.02
        )  # Qwen3-8B loads as 15.27 GiB (r053)


def test_llamacpp_gguf_file_types_and_layer_split():
    m = spec(QWEN3_8B)
    q4 = estimate(m, RTX4090, EngineSettings(engine="llama.cpp", ctx_size=8192, quantization="Q4_K_M"))
    q8 = estimate(m, RTX4090, EngineSettings(engine="llama.cpp", ctx_size=8192, quantization="q8_0"))
    # Q4_K_M is a mix (Q4_K, Q6_K for the output and some attn_v/ffn_down layers): between 4.5 and 5.0
    # bits a weight against Q8_0's 8.5 (tests/test_capacity_gguf_mix.py checks it tensor by tensor).
    assert 4.5 / 8.5 < q4.weights_bytes / q8.weights_bytes < 5.0 / 8.5
    two = estimate(
        m,
        RTX4090,
        EngineSettings(engine="llama.cpp", ctx_size=8192, quantization="Q4_K_M", pipeline_parallel_size=2),
    )
    # llama.cpp's split points over 36 layers + output on two equal cards: layer il goes to device 0 while
    # il / 37 < 0.5, so 19 layers there and 17 + output on device 1 (issue 9390's 8-GPU log: 8,8,8,7,...)
    assert two.kv_cache_bytes == q4.kv_cache_bytes * 19 // 36
    assert [d["layers"] for d in two.extra["devices"]] == [19, 17]


def test_mxfp4_keeps_attention_and_embeddings_unquantized():
    # llm-d r040: gpt-oss-20b at TP2 loads 7.01 GiB per GPU (MXFP4 experts padded to 256, bf16 elsewhere),
    # whether the checkpoint's quantization_config or --quantization mxfp4 names it.
    from capacity_models import GPT_OSS_20B

    m = spec(GPT_OSS_20B)
    for q in (None, "mxfp4"):
        est = estimate(
            m,
            H100,
            EngineSettings(
                engine_version="0.19.0", tensor_parallel_size=2, max_model_len=8192, quantization=q
            ),
        )
        assert est.weights_bytes / GIB == pytest.approx(7.01, rel=0.02)


@pytest.mark.parametrize(
    ("gpu", "tp", "defaults"),
    [
        ("t4", 1, (2048, 8)),
        ("rtx-4090", 1, (2048, 24)),
        ("rtx-4090", 4, (2048, 80)),
        ("l40s", 1, (4096, 32)),
        ("a100-40gb", 4, (4096, 160)),
        ("h100-80gb", 1, (8192, 256)),
        ("h200", 8, (8192, 512)),
        ("b200", 1, (16384, 512)),
    ],
)
def test_sglang_0_5_3_gpu_buckets(gpu, tp, defaults):
    """server_args `_handle_gpu_memory_settings` after PR #10975: chunk and graph batch by card size and TP."""
    ctx = Context(
        spec(LLAMA_31_8B),
        get_gpu(gpu),
        EngineSettings(engine="sglang", engine_version="0.5.6", tensor_parallel_size=tp),
        Constants.defaults(),
    )
    assert gpu_defaults(ctx) == defaults


def test_sglang_default_fraction_on_a_48_gb_card_reserves_for_a_4k_chunk():
    # L40S, 0.5.6: 512 + 4096 x 1.5 + 32 x 2 + 1/8 x 1024 = 6,848 MiB reserved (not 13,440 MiB as with 8k / 256).
    ctx = Context(
        spec(LLAMA_31_8B),
        get_gpu("l40s"),
        EngineSettings(engine="sglang", engine_version="0.5.6"),
        Constants.defaults(),
    )
    gib = ctx.gpu.memory_gib
    assert default_fraction(ctx, *gpu_defaults(ctx)) == round((gib - 6848 / 1024) / gib, 3)


@pytest.mark.parametrize(
    ("version", "note"),
    [
        ("1.3.4", "100 % of the memory free"),
        ("1.4.1", "95 % of the memory free"),
        ("2.3.1", "95 % of the memory free"),
        ("2.4.0", "90 % of the memory free"),
        ("3.0.2", "less 5 % of the card"),
        ("3.2.3", "less 7 % of the card"),
        ("3.3.6", "less 10 % of the card"),
    ],
)
def test_tgi_keeps_back_what_each_release_keeps(version, note):
    """flash_causal_lm.py `warmup` and globals.py TGI_WIGGLE_ROOM at each tag (see engines/tgi.py)."""
    m = spec(LLAMA_31_8B)
    est = estimate(m, H100, EngineSettings(engine="tgi", engine_version=version, max_model_len=4096))
    assert note in part(est, "kv_cache").note
    # blocks of one token from 2.3 (launcher default ATTENTION=flashinfer), 16 before
    assert est.settings["block_size"] == (1 if version >= "2.3" else 16)


def test_tgi_3_0_keeps_half_the_room_of_3_3():
    m = spec(LLAMA_31_8B)
    s: dict[str, Any] = dict(engine="tgi", max_model_len=4096)
    early = estimate(m, H100, EngineSettings(engine_version="3.0.1", **s))
    late = estimate(m, H100, EngineSettings(engine_version="3.3.6", **s))
    assert early.kv_cache_bytes - late.kv_cache_bytes == pytest.approx(0.05 * H100.memory_bytes, rel=0.001)


def test_sglang_splits_the_pool_only_for_its_hybrid_swa_allowlist():
    """configs/model_config.py `is_hybrid_swa_model`: Llama 4, GPT-OSS, MiMo-V2, Step3p5, Gemma 4. Gemma 3 has
    sliding layers but SGLang stores every token in every layer (server_args disables hybrid SWA for Gemma
    2/3); GPT-OSS's hybrid pool is disabled by server_args in the 0.4.x-0.5.x releases."""
    from capacity_models import GPT_OSS_20B

    g = spec(GEMMA3_4B)
    est = estimate(g, H100, EngineSettings(engine="sglang", engine_version="0.5.6", max_model_len=8192))
    assert est.kv_cache_tokens == est.kv_cache_bytes // est.kv_bytes_per_token  # one full cell per token
    oss = spec(GPT_OSS_20B)
    s: dict[str, Any] = dict(engine="sglang", max_model_len=8192, mem_fraction_static=0.85)
    old = estimate(oss, H100, EngineSettings(engine_version="0.5.6", **s))
    new = estimate(oss, H100, EngineSettings(engine_version="0.5.9", **s))
    blackwell = estimate(oss, get_gpu("b200"), EngineSettings(engine_version="0.5.9", **s))
    assert old.kv_cache_tokens == old.kv_cache_bytes // old.kv_bytes_per_token
    # hybrid: full-layer tokens = rest / (full + 0.8 x sliding), half the layers each: 1 / 0.9 more tokens
    assert new.kv_cache_tokens == pytest.approx(new.kv_cache_bytes / (0.9 * new.kv_bytes_per_token), rel=1e-4)
    assert blackwell.kv_cache_tokens == blackwell.kv_cache_bytes // blackwell.kv_bytes_per_token


def test_tgi_default_prefill_tokens_by_release():
    from vramlab.capacity.engines.tgi import default_prefill_tokens

    def default(version, gpu, model=LLAMA_31_8B, max_total=8192):
        ctx = Context(
            spec(model),
            get_gpu(gpu),
            EngineSettings(engine="tgi", engine_version=version),
            Constants.defaults(),
        )
        return default_prefill_tokens(ctx, max_total)

    # TGI 2.2 on an A10G (benchmarks/data r100): "Default `max_total_tokens` to 4096",
    # "Default `max_batch_prefill_tokens` to 4145" (max_input_tokens 4095 + 50).
    est = estimate(spec(LLAMA_31_8B), A10G, EngineSettings(engine="tgi", engine_version="2.2.0"))
    assert est.settings["max_total_tokens"] == 4096 and est.settings["max_batch_prefill_tokens"] == 4145
    # 3.x launcher: card f16 FLOP/s / model FLOP per token where it knows the card; an H100 warms up with far
    # more tokens than an L4, a GeForce card's name is unknown to it (4096), multimodal Gemma 3 gets 8000
    # ("Unkown compute for card nvidia-rtx-a6000" ... "Default `max_batch_prefill_tokens` to 8000" in a
    # public gemma-3-27b log).
    assert default("3.3.6", "h100-80gb") > 5 * default("3.3.6", "l4") > 5 * 4096
    assert default("3.3.6", "rtx-4090") == 4096
    assert default("3.3.6", "rtx-4090", GEMMA3_4B) == 8000
    assert default("1.4.5", "h100-80gb") == 4096
