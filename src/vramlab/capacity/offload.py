"""KV offload tiers: the host memory an engine pins for KV blocks, and what it does to the GPU pool.

- vLLM CPU offloading: `--kv-offloading-size GiB` (all ranks together) with `--kv-offloading-backend native`
  (0.11.1+, vllm/config/vllm.py `_post_init_kv_transfer_config`) sets up the OffloadingConnector, or the connector
  given as `--kv-transfer-config` (0.11.0+: `num_cpu_blocks` in its extra config to 0.13, `cpu_bytes_to_use` from
  0.14; v1/kv_offload/cpu.py). The CPU blocks live in pinned host memory (`cpu/gpu_worker.py`: `pin_memory`,
  `cudaHostRegister`); the GPU pool is sized as without it (the connector allocates no GPU tensors; read in 0.29.0).
- vLLM with LMCache: `--kv-offloading-backend lmcache` is the in-process `LMCacheConnectorV1` with
  `lmcache.max_local_cpu_size` = size / (TP x PP) GiB per rank to 0.22; from 0.23 `LMCacheMPConnector`, a separate
  LMCache server process that holds the KV and sizes its own memory. In process, LMCache's GPU connector also keeps
  a staging buffer of `chunk_size` (256) tokens x the KV of every layer on each GPU (lmcache 0.5.6
  `VLLMPagedMemGPUConnectorV2`, `use_gpu` unless disaggregated), allocated after vLLM sized its pool: it needs the
  1 - util headroom.
- SGLang HiCache (`--enable-hierarchical-cache`, mem_cache/memory_pool_host.py, read in 0.4.9, 0.5.6 and 0.5.14):
  each rank's host pool holds `--hicache-size` GB (10^9 bytes) of tokens, else `--hicache-ratio` (2.0) x the device
  pool's tokens, rounded up by one page; it must be larger than the device pool (an assertion at start-up) and leave
  10 GiB of host memory free ("Not enough host memory available"). The GPU pool is sized as without it
  (model_runner does not read the HiCache flags).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import ENGINE, Component, band
from vramlab.capacity.settings import KVOffload
from vramlab.errors import ConfigError
from vramlab.units import GIB, gib

VLLM_OFFLOADING_CONNECTOR_FROM = (0, 11, 0)
VLLM_KV_OFFLOADING_SIZE_FROM = (0, 11, 1)
# v1/kv_offload/cpu.py reads `num_cpu_blocks` in 0.11.0-0.12.0 and `cpu_bytes_to_use` in 0.14.0 (0.13 not read).
VLLM_CPU_BYTES_FROM = (0, 14)
VLLM_LMCACHE_MP_FROM = (
    0,
    23,
)  # --kv-offloading-backend lmcache -> LMCacheMPConnector (0.22: LMCacheConnectorV1)
LMCACHE_CHUNK_TOKENS = 256  # lmcache/v1/config.py `chunk_size` default
LMCACHE_DEFAULT_CPU_GIB = 5.0  # lmcache/v1/config.py `max_local_cpu_size` default, x 1024**3 bytes
HICACHE_RATIO = 2.0  # SGLang --hicache-ratio default
HICACHE_HOST_MARGIN = 10 * GIB  # memory_pool_host.py: "preserve at least 10GB for other usage"
BACKENDS = {"vllm": ("native", "lmcache"), "sglang": ("hicache",)}


@dataclass(frozen=True)
class HostTier:
    backend: str
    connector: str
    host_bytes_per_gpu: int | None  # None: sized outside the engine (LMCache server)
    host_tokens: int | None
    gpu_pool_change_bytes: int
    sized_by: str

    def to_json(self, gpus: int) -> dict[str, object]:
        return {
            "backend": self.backend,
            "connector": self.connector,
            "host_bytes_per_gpu": self.host_bytes_per_gpu,
            "host_bytes_total": None if self.host_bytes_per_gpu is None else self.host_bytes_per_gpu * gpus,
            "host_tokens": self.host_tokens,
            "gpu_pool_change_bytes": self.gpu_pool_change_bytes,
            "sized_by": self.sized_by,
        }


def check(engine: str, offload: KVOffload, version: tuple[int, ...]) -> None:
    allowed = BACKENDS.get(engine, ())
    if offload.backend not in allowed:
        raise ConfigError(
            f"KV offload {offload.backend!r}: "
            + (
                f"{engine} offers {', '.join(allowed)}"
                if allowed
                else f"not planned for {engine} (vLLM, SGLang)"
            )
        )
    if engine != "vllm" or not version:
        return
    first = VLLM_OFFLOADING_CONNECTOR_FROM if offload.transfer_config else VLLM_KV_OFFLOADING_SIZE_FROM
    if version < first:
        flag = "the OffloadingConnector" if offload.transfer_config else "--kv-offloading-size"
        raise ConfigError(
            f"vLLM {'.'.join(map(str, version))} has no {flag} (from {'.'.join(map(str, first))})"
        )
    if offload.backend == "native" and offload.transfer_config:
        if version >= VLLM_CPU_BYTES_FROM and not offload.size_bytes:
            raise ConfigError(
                'vLLM OffloadingConnector: kv_connector_extra_config needs "cpu_bytes_to_use" (0.14+)'
            )
        if version < VLLM_CPU_BYTES_FROM and not offload.num_cpu_blocks:
            raise ConfigError(
                'vLLM OffloadingConnector: kv_connector_extra_config needs "num_cpu_blocks" (to 0.13)'
            )


def apply(ctx: Context, r: PolicyResult) -> PolicyResult:
    offload = ctx.settings.kv_offload
    if offload is None:
        return r
    check(ctx.settings.engine, offload, ctx.version)
    tier, components, reasons = (_sglang if ctx.settings.engine == "sglang" else _vllm)(ctx, r, offload)
    gpus = ctx.tp * ctx.pp
    reasons += _host_refusal(ctx, tier, gpus)
    note = f"KV offload ({tier.connector}): " + (
        f"{gib(tier.host_bytes_per_gpu, unit=True)} of host memory per GPU ({gib(tier.host_bytes_per_gpu * gpus, unit=True)} "
        f"in all) holds {tier.host_tokens:,} more tokens; {tier.sized_by}"
        if tier.host_bytes_per_gpu is not None and tier.host_tokens is not None
        else tier.sized_by
    )
    extra = {**r.extra, "kv_offload": tier.to_json(gpus)}
    return replace(r, components=components, reasons=r.reasons + reasons, notes=r.notes + [note], extra=extra)


def _vllm(ctx: Context, r: PolicyResult, offload: KVOffload) -> tuple[HostTier, list[Component], list[str]]:
    per_token, ranks = max(1, r.kv_bytes_per_token), ctx.tp * ctx.pp
    version = ctx.version
    if (
        offload.backend == "lmcache"
        and not offload.transfer_config
        and version
        and version >= VLLM_LMCACHE_MP_FROM
    ):
        tier = HostTier(
            "lmcache",
            "LMCacheMPConnector",
            None,
            None,
            0,
            "the KV lives in a separate LMCache server process, which sizes its own memory (--kv-offloading-size is "
            "not passed to it): plan that process's host memory apart; its GPU side is not modelled",
        )
        return tier, list(r.components), []
    if offload.backend == "lmcache":
        host = int(offload.size_bytes / ranks) if offload.size_bytes else int(LMCACHE_DEFAULT_CPU_GIB * GIB)
        staging = LMCACHE_CHUNK_TOKENS * per_token
        comp = band(
            "lmcache_buffer",
            staging,
            0.0,
            0.0,
            ENGINE,
            f"LMCache's GPU staging buffer: {LMCACHE_CHUNK_TOKENS} tokens x every layer's KV, allocated after vLLM "
            "sized its pool (outside the budget: the 1 - util headroom)",
            in_budget=False,
        )
        tier = HostTier(
            "lmcache", "LMCacheConnectorV1", host, host // per_token, 0, "the GPU pool is unchanged"
        )
        return tier, list(r.components) + [comp], []
    if offload.size_bytes:
        host = int(offload.size_bytes / ranks)
    else:
        host = int(offload.num_cpu_blocks or 0) * r.block_size * per_token
    tier = HostTier("native", "OffloadingConnector", host, host // per_token, 0, "the GPU pool is unchanged")
    return tier, list(r.components), []


def _sglang(ctx: Context, r: PolicyResult, offload: KVOffload) -> tuple[HostTier, list[Component], list[str]]:
    per_token = max(1, r.kv_bytes_per_token)
    device_tokens = r.limits(max(0, r.kv_rule(r.components, "mid"))).kv_cache_tokens
    page = 1  # --page-size default
    if offload.size_bytes:
        tokens = int(offload.size_bytes // per_token)
        sized_by = f"--hicache-size {offload.size_bytes / 1e9:g} GB"
    else:
        ratio = offload.ratio if offload.ratio is not None else HICACHE_RATIO
        tokens = int(device_tokens * ratio)
        sized_by = f"--hicache-ratio {ratio:g} x the device pool's {device_tokens:,} tokens"
    tokens = (tokens // page + 1) * page
    reasons = []
    if tokens <= device_tokens:
        reasons.append(
            f"SGLang refuses to start: the host pool ({tokens:,} tokens) must be larger than the device pool "
            f"({device_tokens:,}): raise --hicache-ratio or --hicache-size"
        )
    tier = HostTier(
        "hicache", "HiCache", tokens * per_token, tokens, 0, sized_by + "; the GPU pool is unchanged"
    )
    return tier, list(r.components), reasons


def _host_refusal(ctx: Context, tier: HostTier, gpus: int) -> list[str]:
    host = ctx.settings.host_memory_bytes
    if host is None or tier.host_bytes_per_gpu is None:
        return []
    total = tier.host_bytes_per_gpu * gpus
    margin = HICACHE_HOST_MARGIN if tier.backend == "hicache" else 0
    if total + margin <= host:
        return []
    keep = " and keep 10 GiB free, as SGLang checks" if margin else ""
    return [
        f"the host tier needs {gib(total, unit=True)} of pinned host memory{keep}; --host-memory-gib gives "
        f"{gib(host, unit=True)}"
    ]
