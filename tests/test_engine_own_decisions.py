"""What Ollama and vLLM decide for the user: Ollama's default context by VRAM tier and its llama-server
era, vLLM's `--max-model-len auto`."""

from __future__ import annotations

import pytest

from vramlab.capacity import EngineSettings, custom_gpu, estimate, get_gpu
from vramlab.capacity.engines.ollama import full_offload
from vramlab.capacity.engines.ollama_server import default_num_ctx, generation_batch
from vramlab.capacity.model import run_policy
from vramlab.errors import ConfigError
from vramlab.sources import resolve_model

GIB = 1 << 30


def _ollama(gpu: str, version: str, model: str = "llama-3.1-8b-instruct", **kw: object):
    s = EngineSettings(engine="ollama", engine_version=version, quantization="Q4_K_M", **kw)  # type: ignore[arg-type]
    return estimate(resolve_model(model, offline=True), get_gpu(gpu), s)


@pytest.mark.parametrize(
    ("gpu", "tier"),
    [
        ("rtx-3070", 4096),  # 8 GB: 7.63 GiB
        ("rtx-a6000", 262144),  # 48 GB: 47.50 GiB, over the 47 GiB threshold
        ("l40s", 32768),  # 48 GB nominal but 44.39 GiB: below 47, the 32k tier
        ("a100-80gb", 262144),  # 80 GB
    ],
)
def test_ollama_0155_default_context_comes_from_the_vram_tier(gpu: str, tier: int):
    m = resolve_model("llama-3.1-8b-instruct", offline=True)
    ctx, _ = run_policy(m, get_gpu(gpu), EngineSettings(engine="ollama", engine_version="0.15.5"))
    assert default_num_ctx(ctx)[0] == tier
    est = _ollama(gpu, "0.15.5")
    assert est.settings["num_ctx"] == min(tier, 131072)  # capped at the trained context (llm/server.go)
    assert est.settings["num_parallel"] == 1 and est.kv_cache_tokens == min(tier, 131072)


def _tier(memory_gib: float, **kw: object) -> int:
    m = resolve_model("llama-3.1-8b-instruct", offline=True)
    s = EngineSettings(engine="ollama", engine_version="0.15.5", **kw)  # type: ignore[arg-type]
    ctx, _ = run_policy(m, custom_gpu(memory_gib), s)
    return default_num_ctx(ctx)[0]


@pytest.mark.parametrize(
    ("memory_gib", "tier"),
    [
        (47.0, 262144),  # server/routes.go `Serve` (v0.15.5): totalVRAM >= 47*format.GibiByte
        (47.0 - 1 / 1024, 32768),  # a MiB under 47 GiB: the middle tier
        (23.0, 32768),  # totalVRAM >= 23*format.GibiByte
        (23.0 - 1 / 1024, 4096),  # a MiB under 23 GiB: the fixed 4,096
    ],
)
def test_ollama_tier_thresholds_are_47_and_23_gib_inclusive(memory_gib: float, tier: int):
    # Ollama's source compares in GiB with >= at 47 and 23 ("slightly lower thresholds (47/23 GiB vs. 48/24
    # GiB)"), not the 48/24 GiB its docs print: a 23.0 GiB card gets 32,768, a 47.0 GiB one 262,144
    assert _tier(memory_gib) == tier


def test_ollama_tier_sums_every_card_less_the_overhead_each():
    # totalVRAM += gpu.TotalMemory - envconfig.GpuOverhead(), over every GPU
    half = int(23.5 * GIB)
    assert _tier(23.5, devices=(("a", half), ("b", half))) == 262144  # 47.0 GiB in all
    overhead = 1 << 20  # 1 MiB OLLAMA_GPU_OVERHEAD per card: 46.998 GiB
    assert _tier(23.5, devices=(("a", half), ("b", half)), ollama_gpu_overhead_bytes=overhead) == 32768


def test_ollama_tiers_ignore_parallel_and_subtract_the_gpu_overhead():
    assert _ollama("a100-80gb", "0.15.5", parallel=4).settings["num_ctx"] == 131072
    # 47.50 GiB less a 1 GiB OLLAMA_GPU_OVERHEAD is under 47 GiB: the 32k tier
    assert _ollama("rtx-a6000", "0.15.5", ollama_gpu_overhead_bytes=GIB).settings["num_ctx"] == 32768


def test_ollama_before_0155_keeps_its_fixed_default():
    assert _ollama("a100-80gb", "0.15.4").settings["num_ctx"] == 4096
    assert _ollama("a100-80gb", "0.6.7").settings["num_ctx"] == 2048
    assert _ollama("rtx-3070", "0.15.5", max_model_len=8192).settings["num_ctx"] == 8192


def test_ollama_030_runs_llama_server_and_its_fit():
    est = _ollama("rtx-4090", "0.30.0", model="qwen3-32b", max_model_len=32768)
    assert est.settings["llama_cpp_build"] == "b9452" and est.settings["ctx_size"] == 32768
    assert est.settings["parallel"] == 1 and est.settings["num_batch"] == 512  # Ollama passes -np 1
    assert est.extra["fit"]["status"] == "fitted" and est.settings["n_gpu_layers"] < 65
    assert est.fits and est.extra["devices"][0]["headroom_bytes"] >= 1024 << 20
    old = _ollama("rtx-4090", "0.11.6", model="qwen3-32b", max_model_len=32768)
    # the estimator's decision: not every layer offloaded; the rest run on the CPU (a partial offload, not a refusal)
    assert "fit" not in old.extra and old.fits and not full_offload(old)
    between = _ollama("rtx-4090", "0.20.0", model="qwen3-8b")
    assert any("removed in v0.12.11" in n for n in between.notes)


def test_ollama_generation_batch_follows_the_context_and_the_headroom():
    # sched.go automaticGenerationBatch: 2048 above 32k, 1024 above 4k, 512 else; lowered while the prediction
    # passes 80 % of the free memory with the surcharge, or the 60 % / 75 % shares
    assert generation_batch(4096, 0, 0, None) == 512
    assert generation_batch(8192, 10 * GIB, 24 * GIB, None) == 1024  # 10 <= 18 (75 %), 0.75 GiB <= 19.2 - 10
    assert generation_batch(65536, 10 * GIB, 24 * GIB, None) == 2048  # 10 <= 14.4 (60 %), 2 <= 9.2
    assert generation_batch(65536, 16 * GIB, 24 * GIB, None) == 1024  # 16 > 14.4: not 2048; 16 <= 18
    assert generation_batch(65536, 20 * GIB, 24 * GIB, None) == 512  # 20 > 19.2 (80 %)
    assert generation_batch(65536, 1, 24 * GIB, False) == 512  # no flash attention on CUDA


def _vllm(gpu: str, **kw: object):
    s = EngineSettings(engine="vllm", **kw)  # type: ignore[arg-type]
    return estimate(resolve_model("llama-3.1-8b-instruct", offline=True), get_gpu(gpu), s)


def test_vllm_auto_context_is_the_longest_one_request_the_pool_holds():
    est = _vllm("l4", max_model_len_auto=True)
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 128 KiB per token; a 16-token block of
    # every layer is 2 MiB, so the longest request is (pool // 2 MiB) blocks of 16 tokens
    per_block = 16 * 32 * 8 * 128 * 2 * 2
    assert est.max_model_len == est.kv_cache_bytes // per_block * 16 < 131072
    assert 1.0 <= est.max_concurrency < 1.01 and est.fits
    assert any(n.startswith("Auto-fit max_model_len: reduced from 131072 to ") for n in est.notes)
    # the pool is the one the derived length's profile leaves: the same bytes as with the length given
    assert est.kv_cache_bytes == _vllm("l4", max_model_len=est.max_model_len).kv_cache_bytes


def test_vllm_auto_keeps_the_full_context_when_it_fits_and_needs_0120():
    full = _vllm("h100-80gb", max_model_len_auto=True)
    assert full.max_model_len == 131072 and any(
        "full model context length 131072 fits" in n for n in full.notes
    )
    with pytest.raises(ConfigError, match="no auto-fit"):
        _vllm("l4", max_model_len_auto=True, engine_version="0.11.0")
    with pytest.raises(ConfigError, match="a vLLM setting"):
        estimate(
            resolve_model("qwen3-8b", offline=True),
            get_gpu("l4"),
            EngineSettings(engine="sglang", max_model_len_auto=True),
        )


def test_vllm_kv_cache_memory_bytes_is_the_pool():
    est = _vllm("h100-80gb", kv_cache_memory_bytes=4 * GIB, max_model_len=8192)
    assert est.kv_cache_bytes == 4 * GIB and est.num_blocks == 4 * GIB // (16 * 128 * 1024)
