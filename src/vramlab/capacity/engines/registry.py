"""Which policy module plans an engine on a device, and the vLLM setting that overrides any policy's pool."""

from __future__ import annotations

from dataclasses import replace

from vramlab.capacity.engines.common import PolicyResult
from vramlab.capacity.estimate import DEFAULT
from vramlab.errors import ConfigError

POLICIES = {
    "vllm": "vramlab.capacity.engines.vllm_auto",  # vllm.py's policy, with --max-model-len auto
    "sglang": "vramlab.capacity.engines.sglang",
    "tgi": "vramlab.capacity.engines.tgi",
    "llama.cpp": "vramlab.capacity.engines.llamacpp",
    "transformers": "vramlab.capacity.engines.transformers",
    "ollama": "vramlab.capacity.engines.ollama",
}
# A CPU engine (the device is the host, gpus.host_device): the engines that have a CPU build planned.
HOST_POLICIES = {
    "vllm": "vramlab.capacity.engines.vllm_cpu",
    "llama.cpp": "vramlab.capacity.engines.llamacpp_cpu",
    "transformers": "vramlab.capacity.engines.transformers",
}


def policy_module(engine: str, on_host: bool) -> str:
    if not on_host:
        return POLICIES[engine]
    if engine not in HOST_POLICIES:
        raise ConfigError(
            f"{engine} on the CPU is not planned: the host is planned for vllm (its CPU build), llama.cpp "
            "and transformers"
        )
    return HOST_POLICIES[engine]


def blocks_override(r: PolicyResult, blocks: int) -> PolicyResult:
    """vLLM `--num-gpu-blocks-override N` on a GPU: N blocks whatever the budget leaves (kv_cache_utils.py
    `may_override_num_blocks`, 0.32.0); a block is block_size tokens x the per-token bytes of every layer."""
    pool_bytes = blocks * r.block_size * r.kv_bytes_per_token
    return replace(
        r,
        kv_rule=lambda parts, point: pool_bytes,
        kv_fixed=True,
        kv_provenance=DEFAULT,
        kv_note=f"--num-gpu-blocks-override: {blocks} blocks of {r.block_size} tokens",
    )
