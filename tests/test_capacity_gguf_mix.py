"""llama.cpp's quantization mixes tensor by tensor (src/llama-quant.cpp `llama_tensor_get_type_impl`),
checked against the buffer sizes two real llama-server start-up logs print
(benchmarks/data/observed_memory.jsonl rows r095 and r103, sources there)."""

from __future__ import annotations

import pytest

from vramlab.capacity import Constants, EngineSettings, estimate, get_gpu
from vramlab.capacity import gguf_mix as G
from vramlab.sources import resolve_model

MIB = 1 << 20
RTX3070 = get_gpu("rtx-3070")


def phi3():
    return resolve_model("microsoft/Phi-3-mini-4k-instruct", offline=True)


def qwen3_4b():
    return resolve_model("Qwen/Qwen3-4B", offline=True)


def test_phi3_mini_q4_k_m_matches_the_logged_cuda_and_cpu_buffers():
    # r095: "CUDA0 model buffer size = 2228.82 MiB", "CPU_Mapped model buffer size = 52.84 MiB".
    # Fused attn_qkv -> Q5_K, ffn_down Q6_K in 16 of 32 layers, output Q6_K, untied token_embd Q4_K on the host.
    m = phi3()
    assert G.device_bytes(m, "Q4_K_M", range(m.num_layers)) / MIB == pytest.approx(2228.82, abs=0.02)
    assert G.host_embedding_bytes(m, "Q4_K_M") / MIB == pytest.approx(52.84, abs=0.01)


def test_qwen3_4b_q4_k_m_tied_embedding_is_q6_k_on_both_sides():
    # r103: "CUDA0 model buffer size = 2375.91 MiB", "CPU_Mapped model buffer size = 304.28 MiB":
    # the tied token_embd is quantized as the output (Q6_K) and duplicated onto the GPU as the output.
    m = qwen3_4b()
    assert G.device_bytes(m, "Q4_K_M", range(m.num_layers)) / MIB == pytest.approx(2375.91, abs=0.02)
    assert G.host_embedding_bytes(m, "Q4_K_M") / MIB == pytest.approx(304.28, abs=0.01)


def test_the_plan_uses_the_mix_not_an_average_bits_per_weight():
    m = phi3()
    est = estimate(
        m,
        RTX3070,
        EngineSettings(
            engine="llama.cpp",
            quantization="Q4_K_M",
            ctx_size=4096,
            parallel=1,
            flash_attn=False,
            n_ubatch=256,
        ),
    )
    w = est.component("weights")
    assert w is not None
    assert w.bytes / MIB == pytest.approx(2228.82, abs=0.02)
    assert "Q4_K_M tensor by tensor" in w.note
    assert (w.high_bytes - w.bytes) / w.bytes <= 0.006


def test_use_more_bits_marks_first_and_last_eighth_and_every_third_between():
    assert [i for i in range(32) if G.use_more_bits(i, 32)] == [
        0,
        1,
        2,
        3,
        6,
        9,
        12,
        15,
        18,
        21,
        24,
        27,
        28,
        29,
        30,
        31,
    ]


def test_mix_rules_by_file_type():
    m = qwen3_4b()
    n = m.num_layers
    q4km, q5km, q4ks, q8 = (G.device_bytes(m, f, range(n)) for f in ("Q4_K_M", "Q5_K_M", "Q4_K_S", "Q8_0"))
    assert q4ks < q4km < q5km < q8
    # Q8_0 keeps its output in Q8_0 (never "down" to Q6_K): 34 bytes per 32 weights everywhere but norms.
    out = G.tensor_bytes("Q8_0", m.hidden_size, m.vocab_size)
    assert G.MixRules("Q8_0", "Q8_0", n, 0, False).output(m.hidden_size) == "Q8_0"
    assert q8 > out
    # 80-layer llama: attn_v at least Q5_K in a Q4_K_M file (LLM_TYPE_70B rule); 8 experts: Q8_0.
    assert G.MixRules("Q4_K_M", "Q4_K", 80, 0, True).attn_v(10, 80, fused=False) == "Q5_K"
    assert G.MixRules("Q4_K_M", "Q4_K", 32, 8, False).attn_v(10, 32, fused=False) == "Q8_0"


def test_a_row_length_the_k_block_does_not_divide_falls_back():
    # Qwen2.5-0.5B: hidden 896 is not a multiple of 256: Q4_K -> Q5_0, Q6_K -> Q8_0 (tensor_type_fallback);
    # the output tensor goes to Q8_0.
    m = resolve_model("Qwen/Qwen2.5-0.5B-Instruct", offline=True)
    assert m.hidden_size % 256 != 0
    assert G._fit("Q4_K", m.hidden_size) == "Q5_0" and G._fit("Q6_K", m.hidden_size) == "Q8_0"
    rules = G.MixRules("Q4_K_M", "Q4_K", m.num_layers, 0, False)
    assert rules.output(m.hidden_size) == "Q8_0"
    per_q5_0 = G.tensor_bytes("Q5_0", m.hidden_size, 1)
    assert per_q5_0 == m.hidden_size // 32 * 22


def test_an_unmodelled_mix_keeps_the_average_and_its_wider_band():
    m = phi3()
    assert not G.supported(m, "IQ3_M")
    est = estimate(m, RTX3070, EngineSettings(engine="llama.cpp", quantization="IQ3_M", ctx_size=4096))
    w = est.component("weights")
    assert w is not None
    assert "tensor by tensor" not in w.note and (w.high_bytes - w.bytes) / w.bytes >= 0.02


def test_llama_server_from_pr_23861_reserves_one_logit_row_per_sequence():
    # ggml-org/llama.cpp PR #23861 (2026-05-29): the server's worst-case graph reserves logits for n_seqs,
    # not n_ubatch. r103 (2026 llama-server, Qwen3-4B, -c 8192, unified 4 slots) printed
    # "sched_reserve: CUDA0 compute buffer size = 85.01 MiB": the n_ubatch logits alone would be 297 MiB.
    m = qwen3_4b()
    gpu = get_gpu("l4")
    new = estimate(m, gpu, EngineSettings(engine="llama.cpp", quantization="Q4_K_M", ctx_size=8192))
    old = estimate(
        m,
        gpu,
        EngineSettings(engine="llama.cpp", engine_version="b7079", quantization="Q4_K_M", ctx_size=8192),
    )
    logits_512 = 4 * 512 * m.vocab_size
    # b7079 reserves n_ubatch rows: its output phase (the logits and one hidden-sized tensor) is the peak
    scratch = Constants.defaults()["llamacpp_compute_scratch_bytes"]
    assert old.activation_peak_bytes == logits_512 + 4 * 512 * m.hidden_size + scratch
    # one row: the feed-forward phase is the peak, 3.5 % above the logged 85.01 MiB and inside the band
    assert new.activation_peak_bytes < logits_512
    assert abs(new.activation_peak_bytes / (85.01 * MIB) - 1) < 0.04
    act = new.component("activation_peak")
    assert act is not None
    assert act.low_bytes <= 85.01 * MIB <= act.high_bytes and "logits for 1 rows" in act.note
    py = estimate(
        m, gpu, EngineSettings(engine="llama.cpp", llamacpp_server="llama-cpp-python", quantization="Q4_K_M")
    )
    assert py.activation_peak_bytes > logits_512  # llama-cpp-python's own server still reserves every row
