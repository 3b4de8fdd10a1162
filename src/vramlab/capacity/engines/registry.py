"""Which policy module plans an engine on a device, and the vLLM setting that overrides any policy's pool."""

from __future__ import annotations

from dataclasses import replace

from vramlab.capacity.engines.common import PolicyResult
from vramlab.capacity.estimate import DEFAULT
from vramlab.engines import ENGINES
from vramlab.errors import ConfigError

# The policy module per engine, on a card and on the host (a CPU build: the device is the host,
# gpus.host_device): the engine registry's (vramlab.engines).
POLICIES = {name: e.plan_policy for name, e in ENGINES.items()}
HOST_POLICIES = {name: e.host_policy for name, e in ENGINES.items() if e.host_policy is not None}


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
