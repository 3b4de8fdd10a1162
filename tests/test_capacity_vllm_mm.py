"""vLLM V1's vision-encoder profile for the Qwen2-VL family (capacity/engines/vllm_mm.py): what the start-up
profiles, by release, as its log line says it, and what the plan takes off the budget for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from capacity_models import row_estimate
from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.engines.vllm_mm import encoder_profile, limits_of
from vramlab.capacity.planning import parse_mm_limits
from vramlab.capacity.settings import parse_version
from vramlab.errors import ConfigError
from vramlab.sources import resolve_model
from vramlab.sources.hf_config import spec_from_config

QWEN25_VL = resolve_model("qwen2.5-vl-7b-instruct", offline=True)
GIB = 1 << 30


def _profile(
    version: str, max_model_len: int, mnbt: int = 2048, seqs: int = 256, limits=None, model=QWEN25_VL
):
    return encoder_profile(
        model,
        max_model_len=max_model_len,
        max_num_batched_tokens=mnbt,
        max_num_seqs=seqs,
        chunked_prefill=True,
        limits=limits_of(limits),
        version=parse_version(version),
        model_dtype="bfloat16",
        tp=1,
    )


def test_r217_log_line_budget_and_items():
    """vLLM 0.23.0 at max_model_len 128000 printed: 'Encoder cache will be initialized with a budget of 114688
    tokens, and profiled with 1 video items of the maximum feature size.' (benchmarks/data row r217)."""
    p = _profile("0.23.0", 128000)
    assert (p.budget_tokens, p.items, p.modality, p.tokens_per_item) == (114688, 1, "video", 114688)
    assert p.patches == 114688 * 4


@pytest.mark.parametrize(
    "version,max_model_len,tokens",
    [
        ("0.23.0", 8192, 16384),  # shorter than one frame pair: still one frame (at least 1)
        ("0.23.0", 32768, 32768),  # 4 frames -> 2 temporal slices
        ("0.13.0", 128000, 114688),  # {modality: 1} from 0.13: 14 frames
        ("0.11.0", 128000, 16384),  # the prompt limit (999 videos) shares the frames: one frame
        ("0.10.2", 128000, 16384),
        ("0.9.2", 128000, 16384),
    ],
)
def test_largest_item_follows_each_release(version, max_model_len, tokens):
    assert _profile(version, max_model_len).tokens_per_item == tokens


def test_frames_cap_is_16_before_0_11_when_one_video_is_allowed():
    """With --limit-mm-per-prompt video=1 the frames are not shared: 0.10.2 caps them at 16, 0.11 at 14."""
    one = (("image", 1), ("video", 1))
    assert _profile("0.10.2", 200000, limits=one).tokens_per_item == 8 * 16384
    assert _profile("0.11.0", 200000, limits=one).tokens_per_item == 7 * 16384


def test_items_fill_the_batched_token_budget():
    """Images of 16,384 tokens: floor(budget / item) from 0.10, capped by max_num_seqs x per-prompt items."""
    images = (("video", 0),)
    assert _profile("0.23.0", 32768, mnbt=65536, limits=images).items == 4
    assert _profile("0.23.0", 32768, mnbt=65536, seqs=2, limits=(("image", 1), ("video", 0))).items == 2
    assert _profile("0.9.2", 32768, mnbt=40000, limits=images).items == 3  # cdiv before 0.10


def test_every_modality_off_profiles_nothing():
    assert _profile("0.23.0", 128000, limits=(("image", 0), ("video", 0))) is None


def test_encoder_peak_grows_with_the_video_and_dominates_the_activation():
    s = EngineSettings(engine="vllm", engine_version="0.23.0", gpu_memory_utilization=0.9)
    gpu = get_gpu("a100-80gb")
    acts = [
        estimate(QWEN25_VL, gpu, s.with_(max_model_len=n)).activation_peak_bytes
        for n in (8192, 32768, 128000)
    ]
    assert acts[0] < acts[1] < acts[2]
    off = estimate(QWEN25_VL, gpu, s.with_(max_model_len=128000, limit_mm_per_prompt=(("video", 0),)))
    assert off.activation_peak_bytes < acts[2] / 4
    assert off.kv_cache_bytes > estimate(QWEN25_VL, gpu, s.with_(max_model_len=128000)).kv_cache_bytes


def test_r217_failed_start_is_predicted_with_the_logged_deficit_inside_the_band():
    """r217 failed: 'Available KV cache memory: -14.28 GiB' then 'No available memory for the cache blocks'."""
    row, est = row_estimate("r217")
    assert not est.fits and any("No available memory" in r for r in est.reasons)
    logged = row["kv_cache_gib"] * GIB
    assert est.kv_available_bytes < 0
    assert abs(est.kv_available_bytes - logged) < 0.05 * abs(logged)
    act = est.component("activation_peak")
    assert "1 video item(s) of 114,688 tokens" in act.note


def test_suggestion_turns_videos_off_and_then_it_fits():
    """A 64k context on 0.23: the profiled video (65,536 tokens) leaves no KV at util 0.3; without videos it fits."""
    s = EngineSettings(
        engine="vllm", engine_version="0.23.0", gpu_memory_utilization=0.3, max_model_len=65536
    )
    est = estimate(QWEN25_VL, get_gpu("a100-80gb"), s)
    tip = next((x for x in est.suggestions if "--limit-mm-per-prompt" in x), None)
    assert not est.fits and tip is not None
    assert estimate(QWEN25_VL, get_gpu("a100-80gb"), s.with_(limit_mm_per_prompt=(("video", 0),))).fits


def test_qwen2_vl_tower_from_its_config():
    """Qwen2-VL's vision_config names the width embed_dim and the MLP mlp_ratio (QuickGELU, not gated)."""
    config = {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "num_hidden_layers": 28,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "mlp_ratio": 4,
            "num_heads": 16,
            "in_chans": 3,
            "hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }
    m = spec_from_config(config, "Qwen/Qwen2-VL-7B-Instruct", "test")
    assert m.vision is not None and not m.vision.gated
    assert (m.vision.intermediate_size, m.vision.out_hidden_size) == (5120, 3584)
    assert _profile("0.23.0", 32768, model=m).tokens_per_item == 32768
    other = spec_from_config({**config, "architectures": ["LlavaForConditionalGeneration"]}, "x", "test")
    assert other.vision is None  # a tower whose profile is not modelled keeps the widened band


@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"image": 2, "video": 0}', (("image", 2), ("video", 0))),
        ("image=2,video=0", (("image", 2), ("video", 0))),
        ('{"video": {"count": 1, "num_frames": 32}}', (("video", 1),)),
    ],
)
def test_limit_mm_per_prompt_parses_vllms_forms(text, expected):
    assert parse_mm_limits(text) == expected


@pytest.mark.parametrize("text", ["foo=1", "image=-1", "image=two", "{", "[1]", ""])
def test_limit_mm_per_prompt_refuses_bad_input(text):
    with pytest.raises(ConfigError):
        parse_mm_limits(text)


def test_cli_flag_and_bad_input():
    base = [
        sys.executable,
        "-m",
        "vramlab",
        "plan",
        "--model",
        "qwen2.5-vl-7b-instruct",
        "--gpu",
        "a100-80gb",
        "--engine-version",
        "0.23.0",
        "--max-model-len",
        "128000",
        "--json",
    ]
    import json

    on = json.loads(subprocess.run(base, capture_output=True, text=True, check=False).stdout)
    off = json.loads(
        subprocess.run(
            base + ["--limit-mm-per-prompt", "video=0"], capture_output=True, text=True, check=False
        ).stdout
    )
    assert off["activation_peak_bytes"] < on["activation_peak_bytes"]
    bad = subprocess.run(
        base + ["--limit-mm-per-prompt", "pictures=2"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


# Lines copied from the two public logs behind rows r217 (vLLM 0.23.0, A100) and r218 (0.11.0rc2, ROCm).
R217_LOG = """\
(APIServer pid=1) INFO 07-01 04:23:28 [api_utils.py:273] non-default args: {'model_tag': '/models/Qwen2.5-VL-7B-Instruct', 'model': '/models/Qwen2.5-VL-7B-Instruct', 'trust_remote_code': True, 'served_model_name': ['qwen2.5-vl'], 'gpu_memory_utilization': 0.22}
(APIServer pid=1) INFO 07-01 04:23:39 [model.py:1745] Using max model len 128000
(EngineCore pid=129) INFO 07-01 04:23:50 [core.py:113] Initializing a V1 LLM engine (v0.23.0) with config: model='/models/Qwen2.5-VL-7B-Instruct', speculative_config=None, tokenizer='/models/Qwen2.5-VL-7B-Instruct', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=True, dtype=torch.bfloat16, max_seq_len=128000, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1
(EngineCore pid=129) INFO 07-01 04:23:52 [topk_topp_sampler.py:55] Using FlashInfer for top-p & top-k sampling.
(EngineCore pid=129) INFO 07-01 04:23:59 [gpu_model_runner.py:5187] Model loading took 15.67 GiB memory and 2.938506 seconds
(EngineCore pid=129) INFO 07-01 04:23:59 [gpu_model_runner.py:6200] Encoder cache will be initialized with a budget of 114688 tokens, and profiled with 1 video items of the maximum feature size.
(EngineCore pid=129) INFO 07-01 04:24:37 [gpu_model_runner.py:6517] Estimated CUDA graph memory: 0.53 GiB total
(EngineCore pid=129) INFO 07-01 04:24:37 [gpu_worker.py:480] Available KV cache memory: -14.28 GiB
(EngineCore pid=129) ERROR 07-01 04:24:37 [core.py:1195] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.
"""
R218_ARGS = (
    "non-default args: {'model_tag': '/google/gemma-3-27b-it', 'model': '/google/gemma-3-27b-it', "
    "'max_model_len': 4096, 'limit_mm_per_prompt': {'image': 2}}"
)


def test_check_log_reads_the_encoder_profile_and_compares_it_with_the_plan(tmp_path):
    from vramlab.logs import vllm as vllm_log

    obs = vllm_log.parse(R217_LOG.splitlines())[0]
    assert (
        obs.extra["encoder_budget_tokens"],
        obs.extra["encoder_items"],
        obs.extra["encoder_modality"],
    ) == (114688, 1, "video")
    assert vllm_log.parse([R218_ARGS])[0].settings["limit_mm_per_prompt"] == (("image", 2),)
    log = tmp_path / "qwen25vl.log"
    log.write_text(R217_LOG)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "check-log",
            str(log),
            "--model",
            "qwen2.5-vl-7b-instruct",
            "--gpu",
            "a100-80gb",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert (
        "vision encoder profile: the log 114,688 tokens, 1 video item(s); the plan 114,688 tokens, "
        "1 video item(s)\n"
    ) in run.stdout
    kv = next(line for line in run.stdout.splitlines() if line.strip().startswith("kv_cache "))
    assert "-14.28" in kv and "-14.1" in kv, kv  # the failed start-up's signed figure beside the plan's


def test_pipeline_stages_after_the_first_do_not_profile_the_tower():
    """V1 runs the tower on the first pipeline stage only: the last stage's activation carries no encoder
    memory and says where it went."""
    from vramlab.capacity import Constants
    from vramlab.capacity.engines import vllm_activation as policy
    from vramlab.capacity.engines.common import Context
    from vramlab.capacity.engines.vllm_eras import resolve_setup

    s = EngineSettings(engine="vllm", engine_version="0.23.0", max_model_len=128000, pipeline_parallel_size=2)
    ctx = Context(QWEN25_VL, get_gpu("a100-80gb"), s, Constants.defaults())
    setup = resolve_setup(ctx)
    first = policy.activation_component(
        ctx, setup, last_stage=False, first_stage=True, enc=policy.stage0_encoder(ctx, setup)
    )
    last = policy.activation_component(ctx, setup, last_stage=True, first_stage=False)
    assert first.bytes > 10 * GIB and "1 video item(s)" in first.note
    assert last.bytes < 2 * GIB and "profiled on the first pipeline stage" in last.note
