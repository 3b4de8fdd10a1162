"""vLLM eras, cards and context rules, checked against public start-up logs (benchmarks/data rows)
and vLLM's own source rules (each test names its source)."""

from __future__ import annotations

import json
import sys

import pytest

from _narrow import some
from capacity_models import LLAMA_31_8B, QWEN3_8B, ROOT, ROWS, part, row_estimate, spec
from vramlab.capacity import GIB, EngineSettings, custom_gpu, estimate, get_gpu
from vramlab.errors import ConfigError

H100, T4 = get_gpu("h100-80gb"), get_gpu("t4")


def by_source(fragment: str) -> str:
    return next(rid for rid, r in ROWS.items() if fragment in r["source"])


# --- V0 at TP > 1: the non-torch term follows the interconnect ---------------------------------


def test_v0_tp8_on_an_nvswitch_node_matches_the_p4d_log():
    # DeepSeek-Coder-V2-Lite, vLLM 0.7.1 V0, 8x A100-40GB SXM (p4d): non_torch_memory takes 2.10GiB, KV 29.02GiB.
    row, est = row_estimate(by_source("3706561278"))
    nt = est.component("non_torch")
    assert nt.low_bytes <= row["non_torch_gib"] * GIB <= nt.high_bytes
    assert est.kv_cache_bytes / GIB == pytest.approx(row["kv_cache_gib"], rel=0.03)


def test_v0_07_mla_weights_include_the_absorbed_decode_matrices():
    # V0 0.7.x MLACommonImpl keeps absorbed W_Q_UK / W_UV_O (FP8-requantized for an FP8 checkpoint) beside
    # the raw weights. DeepSeek-R1 FP8, TP 8 on H200 (~0.7.3): "model weights take 83.88GiB";
    # DeepSeek-Coder-V2-Lite fp16, TP 8 on A100-40GB (0.7.1): "model weights take 3.97GiB".
    for fragment in ("20903468563", "3706561278"):
        row, est = row_estimate(by_source(fragment))
        assert est.weights_bytes / GIB == pytest.approx(row["weights_gib"], rel=0.01)
        assert "absorbed MLA matrices" in part(est, "weights").note
    row, est = row_estimate(by_source("20903468563"))
    assert any(
        "non-torch term at this size is not modelled" in n for n in est.notes
    )  # still unknown: 7.16 GiB
    # Which later release dropped the absorption is not pinned: no matrices added, band widened instead.
    later = estimate(
        spec_of_row(ROWS[by_source("20903468563")]),
        get_gpu("h200"),
        EngineSettings(engine_version="0.8.5", vllm_engine="v0", tensor_parallel_size=8, max_model_len=32768),
    )
    assert "absorbed" not in part(later, "weights").note
    assert any("absorbed MLA matrices of this release" in n for n in later.notes)


def test_vllm_inside_a_trainer_is_an_unknown_term_with_a_wider_band():
    # Unsloth notebooks run vLLM's LLM class inside GRPO trainers: KV errors from -41 % to +100 % there,
    # against 0.3 % median elsewhere, and no engine rule describes the trainer's share of the process.
    m = spec(QWEN3_8B)
    plain = estimate(
        m, get_gpu("l4"), EngineSettings(engine_version="0.8.5", api_server=False, max_model_len=4096)
    )
    trainer = estimate(
        m,
        get_gpu("l4"),
        EngineSettings(engine_version="0.8.5", api_server=False, in_trainer=True, max_model_len=4096),
    )
    assert trainer.kv_cache_bytes == plain.kv_cache_bytes  # same point estimate: no number borrowed
    assert some(trainer.pessimistic).kv_cache_bytes < some(plain.pessimistic).kv_cache_bytes
    assert any(
        n.startswith("unknown term, band widened: vLLM inside a training process") for n in trainer.notes
    )
    row, est = row_estimate(by_source("55765941562"))  # a GRPO log: V0 inside the trainer on a Colab T4
    assert any("inside a training process" in n for n in est.notes)


def spec_of_row(row):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import accuracy

    configs = json.loads((ROOT / "benchmarks" / "data" / "model_configs.json").read_text())
    return accuracy.model_for(row, configs)


def test_v0_tp_on_pcie_cards_is_a_few_hundred_mib_not_the_nvswitch_figure():
    # vLLM V0 logs on PCIe cards: 0.25 GiB at TP2 on 2x RTX 4090 (vllm#13061), 0.36 GiB at TP8 on L40S
    # (custom all-reduce disabled above two PCIe GPUs); 0.19's V1 constant (2.1 GiB) must not leak in.
    m = spec(QWEN3_8B)
    for gpu, tp in ((get_gpu("rtx-4090"), 2), (get_gpu("l40s"), 8)):
        est = estimate(
            m, gpu, EngineSettings(engine_version="0.7.3", tensor_parallel_size=tp, max_model_len=4096)
        )
        nt = est.component("non_torch")
        assert nt is not None
        assert nt.low_bytes <= 0.36 * GIB and nt.high_bytes >= 0.20 * GIB and nt.bytes < 0.5 * GIB
        assert "PCIe" in nt.note
    sxm = estimate(
        m,
        get_gpu("a100-80gb"),
        EngineSettings(engine_version="0.7.3", tensor_parallel_size=8, max_model_len=4096),
    )
    assert part(sxm, "non_torch").bytes > 1.5 * GIB


# --- V0 automatic chunked prefill ---------------------------------------------------------------


def test_v0_turns_chunked_prefill_on_above_32k_and_profiles_the_chunk():
    # vLLM V0 EngineArgs: max_model_len > 32K on CUDA without a sliding window -> chunked prefill on;
    # the NIM A1 log at 131,072 shows "max_num_batched_tokens=2048".
    m = spec(LLAMA_31_8B)
    long = estimate(m, H100, EngineSettings(engine_version="0.7.3", max_model_len=131072))
    assert long.settings["chunked_prefill"] and long.settings["max_num_batched_tokens"] == 2048
    assert any("chunked prefill above a 32k" in n for n in long.notes)
    off = estimate(
        m, H100, EngineSettings(engine_version="0.7.3", max_model_len=131072, enable_chunked_prefill=False)
    )
    assert off.settings["max_num_batched_tokens"] == 131072
    assert off.activation_peak_bytes > 4 * long.activation_peak_bytes
    short = estimate(m, H100, EngineSettings(engine_version="0.7.3", max_model_len=32768))
    assert not short.settings["chunked_prefill"] and short.settings["max_num_batched_tokens"] == 32768
    # The 0.6 series chunked at 512 ("Chunked prefill is enabled with max_num_batched_tokens=512.").
    old = estimate(m, H100, EngineSettings(engine_version="0.6.3", max_model_len=131072))
    assert old.settings["max_num_batched_tokens"] == 512


# --- --vllm-engine v0 without a version ----------------------------------------------------------


def test_v0_without_a_version_is_the_last_release_that_had_v0():
    est = estimate(spec(LLAMA_31_8B), H100, EngineSettings(vllm_engine="v0", max_model_len=8192))
    assert est.engine_version == "0.10.2" and est.settings["engine_mode"] == "v0"
    with pytest.raises(ConfigError, match="no V0 engine"):
        estimate(spec(LLAMA_31_8B), H100, EngineSettings(vllm_engine="v0", engine_version="0.11.0"))


# --- context length: max_position_embeddings and rope scaling, never the sliding window ----------


def test_context_comes_from_rope_scaling_not_the_sliding_window():
    yarn = spec(
        {
            **QWEN3_8B,
            "max_position_embeddings": 32768,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        }
    )
    assert yarn.context_length == 131072
    llama3 = spec(
        {
            **LLAMA_31_8B,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
        }
    )
    assert llama3.context_length == 131072  # llama3 configs already state the extended length
    windowed = spec({**QWEN3_8B, "max_position_embeddings": 32768, "sliding_window": 4096})
    assert windowed.context_length == 32768
    est = estimate(windowed, H100, EngineSettings(engine_version="0.19.0"))
    assert est.max_model_len == 32768


def test_a_length_above_the_trained_one_needs_the_users_override_and_warns():
    m = spec({**QWEN3_8B, "max_position_embeddings": 32768})
    with pytest.raises(ConfigError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        estimate(m, H100, EngineSettings(engine_version="0.19.0", max_model_len=65536))
    allowed = estimate(
        m, H100, EngineSettings(engine_version="0.19.0", max_model_len=65536, allow_long_max_model_len=True)
    )
    assert allowed.max_model_len == 65536 and any(
        "above the model's trained context" in n for n in allowed.notes
    )
    # A rope-scaling override extends the derived length itself: no warning needed up to it.
    roped = estimate(
        m, H100, EngineSettings(engine_version="0.19.0", max_model_len=65536, rope_scaling_factor=2.0)
    )
    assert roped.max_model_len == 65536 and not any("trained context" in n for n in roped.notes)


# --- pre-Ampere and ROCm cards --------------------------------------------------------------------


@pytest.mark.parametrize("fragment", ["4922787267", "69421856836"])
def test_pre_ampere_v0_rows_match_their_logs(fragment):
    # V100 (vLLM 0.7.1) and T4 (0.6.6.post1) start-ups with the XFormers backend.
    row, est = row_estimate(by_source(fragment))
    assert est.kv_cache_bytes / GIB == pytest.approx(row["kv_cache_gib"], rel=0.03)
    assert est.max_concurrency == pytest.approx(row["max_concurrency"], rel=0.03)
    assert any("XFormers" in n for n in est.notes)


def test_pre_ampere_rules_come_from_vllm():
    m = spec(LLAMA_31_8B)
    with pytest.raises(ConfigError, match="compute capability 7.0"):
        estimate(m, get_gpu("p40"), EngineSettings(max_model_len=4096))
    with pytest.raises(ConfigError, match="Bfloat16 is only supported"):
        estimate(m, T4, EngineSettings(engine_version="0.7.3", dtype="bfloat16", max_model_len=2048))
    # `auto` on a Turing card: "Casting torch.bfloat16 to torch.float16." (the V100 row's log).
    assert (
        estimate(m, T4, EngineSettings(engine_version="0.7.3", max_model_len=2048)).settings["dtype"]
        == "float16"
    )
    # llama.cpp runs on Pascal.
    assert estimate(m, get_gpu("p40"), EngineSettings(engine="llama.cpp", ctx_size=4096)).kv_cache_bytes > 0


def test_unknown_era_or_card_widens_the_band_and_says_so():
    m = spec(LLAMA_31_8B)
    base = estimate(m, H100, EngineSettings(engine_version="0.19.0", max_model_len=8192))
    for gpu, version in ((get_gpu("mi300x"), "0.19.0"), (H100, "0.4.2"), (H100, "0.31.0")):
        est = estimate(m, gpu, EngineSettings(engine_version=version, max_model_len=8192))
        act, base_act = part(est, "activation_peak"), part(base, "activation_peak")
        assert (act.high_bytes - act.bytes) / act.bytes > (
            base_act.high_bytes - base_act.bytes
        ) / base_act.bytes
        assert any(n.startswith("unknown term, band widened") for n in est.notes)
    assert not any(n.startswith("unknown term") for n in base.notes)


def test_the_printed_total_is_the_card():
    # A T4 shows 14.56 GiB on one driver and 14.74 on another: the log's figure is used.
    card = custom_gpu(14.56, like=T4)
    assert card.arch == "turing" and card.memory_gib == 14.56


def test_v0_on_a_3090_fails_at_29k_but_starts_at_35k_as_the_user_reported():
    # vllm#10517: Llama-3.1-8B on an RTX 3090, util 0.9. 20k starts (KV 3.81 GiB), 29k fails ("max seq len
    # (29000) is larger than ... (23648)"), 35k and 45k start: above 32k V0 chunks the profile.
    row, est20 = row_estimate(
        next(rid for rid, r in ROWS.items() if "10517" in r["source"] and r["max_model_len"] == 20000)
    )
    assert est20.fits and est20.kv_cache_bytes / GIB == pytest.approx(row["kv_cache_gib"], rel=0.03)
    row29, est29 = row_estimate(
        next(rid for rid, r in ROWS.items() if "10517" in r["source"] and r["max_model_len"] == 29000)
    )
    assert not est29.fits and any("To serve at least one request" in r for r in est29.reasons)
    assert est29.kv_cache_tokens == pytest.approx(row29["kv_cache_tokens"], rel=0.03)
    m, card = spec(LLAMA_31_8B), custom_gpu(23.58, like=get_gpu("rtx-3090"))
    est35 = estimate(
        m, card, EngineSettings(engine_version="0.6.3", gpu_memory_utilization=0.9, max_model_len=35000)
    )
    assert est35.fits and est35.settings["chunked_prefill"]
