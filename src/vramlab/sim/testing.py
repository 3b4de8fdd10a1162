"""Hand-built estimates for tests and rehearsals that must not depend on the capacity model's numbers."""

from __future__ import annotations

from vramlab.capacity.estimate import ENGINE, FORMULA, Component, Estimate
from vramlab.units import GIB


def make_estimate(
    gpu: str = "h100-80gb",
    engine: str = "vllm",
    model: str = "llama-3.1-8b-instruct",
    weights_gib: float = 14.99,
    activation_gib: float = 1.2,
    non_torch_gib: float = 0.5,
    cuda_graph_gib: float = 0.5,
    util: float = 0.9,
    kv_bytes_per_token: int = 131072,
    block_size: int = 16,
    max_model_len: int = 4096,
    max_num_seqs: int = 256,
    kv_cache_gib: float | None = None,
) -> Estimate:
    """A vLLM-like estimate: KV = util x card - weights - activation - non-torch - graphs (or *kv_cache_gib*)."""
    from vramlab.capacity.gpus import get_gpu

    card = get_gpu(gpu)
    total = card.memory_bytes
    budget = int(util * total)
    parts = {
        "weights": weights_gib,
        "activation_peak": activation_gib,
        "non_torch": non_torch_gib,
        "cuda_graphs": cuda_graph_gib,
    }
    comps = [Component(k, int(v * GIB), int(v * GIB), int(v * GIB), FORMULA) for k, v in parts.items()]
    non_kv = sum(c.bytes for c in comps)
    kv = int(kv_cache_gib * GIB) if kv_cache_gib is not None else budget - non_kv
    block_bytes = block_size * kv_bytes_per_token
    num_blocks = max(0, kv // block_bytes)
    tokens = num_blocks * block_size
    comps.append(Component("kv_cache", kv, kv, kv, ENGINE))
    used = non_kv + max(0, kv)
    return Estimate(
        model=model,
        gpu=card.name,
        engine=engine,
        engine_version="",
        gpu_memory_bytes=total,
        settings={
            "gpu_memory_utilization": util,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
        },
        components=tuple(comps),
        kv_bytes_per_token=kv_bytes_per_token,
        block_size=block_size,
        num_blocks=num_blocks,
        kv_cache_bytes=kv,
        kv_cache_tokens=tokens,
        max_concurrency=tokens / max_model_len,
        max_model_len=max_model_len,
        budget_bytes=budget,
        used_bytes=used,
        headroom_bytes=total - used,
        fits=kv > 0 and tokens >= max_model_len,
    )
