"""KV offload tiers (capacity/offload.py): host memory planned per GPU, the tokens it holds and the GPU pool, per
engine and release. Expected figures are worked out by hand in the comments."""

from __future__ import annotations

import pytest

from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.settings import KVOffload
from vramlab.errors import ConfigError
from vramlab.sources import resolve_model

GIB = 1 << 30
H100 = get_gpu("h100-80gb")


@pytest.fixture(scope="module")
def llama():
    return resolve_model("llama-3.1-8b-instruct")


def plan(model, settings):
    return estimate(model, H100, settings, with_suggestions=False)


def test_vllm_native_offload_splits_the_size_over_ranks_and_leaves_the_gpu_pool(llama):
    base = EngineSettings(engine="vllm", max_model_len=8192, tensor_parallel_size=2)
    without = plan(llama, base)
    tier = plan(llama, base.with_(kv_offload=KVOffload("native", size_bytes=100 * GIB)))
    host = tier.extra["kv_offload"]
    # --kv-offloading-size 100 over TP 2: 50 GiB a rank; a token costs 32 layers x 4 KV heads x 128 x 2 x 2 B =
    # 65,536 B on a rank: 53,687,091,200 / 65,536 = 819,200 tokens
    assert host["host_bytes_per_gpu"] == 50 * GIB and host["host_bytes_total"] == 100 * GIB
    assert host["host_tokens"] == 819_200
    assert host["connector"] == "OffloadingConnector" and host["gpu_pool_change_bytes"] == 0
    assert tier.kv_cache_bytes == without.kv_cache_bytes


def test_vllm_offloading_connector_blocks_before_014(llama):
    settings = EngineSettings(
        engine="vllm",
        engine_version="0.12.0",
        max_model_len=8192,
        kv_offload=KVOffload("native", num_cpu_blocks=1000, transfer_config=True),
    )
    host = plan(llama, settings).extra["kv_offload"]
    assert host["host_bytes_per_gpu"] == 1000 * 16 * 131_072  # blocks x 16 tokens x 131,072 B
    with pytest.raises(ConfigError, match="cpu_bytes_to_use"):
        plan(llama, settings.with_(engine_version="0.14.0"))
    with pytest.raises(ConfigError, match="no --kv-offloading-size"):
        plan(llama, settings.with_(engine_version="0.11.0", kv_offload=KVOffload("native", size_bytes=GIB)))


def test_vllm_lmcache_in_process_until_023(llama):
    base = EngineSettings(
        engine="vllm", max_model_len=8192, kv_offload=KVOffload("lmcache", size_bytes=40 * GIB)
    )
    in_process = plan(llama, base.with_(engine_version="0.20.0"))
    staging = in_process.component("lmcache_buffer")
    assert staging.bytes == 256 * 131_072 and not staging.in_budget  # chunk_size 256 x the KV a token costs
    assert in_process.extra["kv_offload"]["host_bytes_per_gpu"] == 40 * GIB
    server = plan(llama, base.with_(engine_version="0.23.0"))
    assert server.extra["kv_offload"]["connector"] == "LMCacheMPConnector"
    assert (
        server.extra["kv_offload"]["host_bytes_per_gpu"] is None
        and server.component("lmcache_buffer") is None
    )


def test_sglang_hicache_ratio_size_and_the_assertion(llama):
    base = EngineSettings(engine="sglang", max_model_len=8192)
    without = plan(llama, base)
    device = without.kv_cache_tokens
    tier = plan(llama, base.with_(kv_offload=KVOffload("hicache")))
    assert tier.kv_cache_tokens == device  # the GPU pool is sized as without HiCache
    assert tier.extra["kv_offload"]["host_tokens"] == 2 * device + 1  # ratio 2.0, rounded up by one page
    sized = plan(llama, base.with_(kv_offload=KVOffload("hicache", size_bytes=50 * 10**9)))
    # --hicache-size 50 GB = 5e10 B / 131,072 B = 381,469 tokens, + one page
    assert sized.extra["kv_offload"]["host_tokens"] == 381_470
    small = plan(llama, base.with_(kv_offload=KVOffload("hicache", ratio=0.5)))
    assert not small.fits and any("must be larger than the device pool" in r for r in small.reasons)


def test_host_memory_is_checked_with_sglangs_10_gib(llama):
    tier = KVOffload("hicache", size_bytes=100 * 10**9)
    base = EngineSettings(engine="sglang", max_model_len=8192, kv_offload=tier)
    # 1e11 B / 131,072 B = 762,939 tokens + one page = 762,940 x 131,072 B = 93.13 GiB, + 10 GiB kept free
    assert plan(llama, base.with_(host_memory_bytes=104 * GIB)).fits
    short = plan(llama, base.with_(host_memory_bytes=103 * GIB))
    assert not short.fits and any("keep 10 GiB free" in r for r in short.reasons)


def test_a_tier_the_engine_does_not_have_is_refused(llama):
    with pytest.raises(ConfigError, match="sglang offers hicache"):
        plan(llama, EngineSettings(engine="sglang", kv_offload=KVOffload("native", size_bytes=GIB)))
    with pytest.raises(ConfigError, match="not planned for tgi"):
        plan(llama, EngineSettings(engine="tgi", kv_offload=KVOffload("hicache")))
