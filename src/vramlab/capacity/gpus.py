"""The planning targets: cards (`gpu_catalog.py`), unified-memory machines (`gpu_unified.py`), MIG slices
(`gpu_mig.py`, named `CARD:PROFILE`, e.g. h100-80gb:3g.40gb) and a capped share of a card (`capped_gpu`).

`memory_gib` is `torch.cuda.mem_get_info()[1]` / vLLM's `total_gpu_memory`, not the marketing number: an
"80 GB" H100 shows 79.19 GiB. Planners that use the nominal figure over-predict KV cache by util x the
difference on every row (docs/research/llm-d-planner-anchor.md).
"""

from __future__ import annotations

from dataclasses import replace

from vramlab.capacity.gpu_catalog import CARDS
from vramlab.capacity.gpu_mig import PROFILES, mig_profile, profiles_of
from vramlab.capacity.gpu_spec import (
    CAPPED,
    DISCRETE,
    GPU,
    HOST_DEVICE,
    HOST_NAMES,
    HOST_VENDOR,
    KINDS,
    MIG,
    UNIFIED,
)
from vramlab.capacity.gpu_unified import UNIFIED_MACHINES
from vramlab.errors import ConfigError, unknown

__all__ = [
    "CAPPED",
    "DEVICES",
    "DISCRETE",
    "GPU",
    "GPUS",
    "HOST_DEVICE",
    "HOST_NAMES",
    "HOST_VENDOR",
    "KINDS",
    "MIG",
    "UNIFIED",
    "capped_gpu",
    "custom_gpu",
    "get_gpu",
    "host_device",
]

GPUS: tuple[GPU, ...] = CARDS  # discrete cards: what a log's total memory is matched against
DEVICES: tuple[GPU, ...] = CARDS + UNIFIED_MACHINES + profiles_of(CARDS)  # every planning target

_BY_NAME: dict[str, GPU] = {}
for _g in DEVICES:
    _BY_NAME[_g.name] = _g
    for _a in _g.aliases:
        _BY_NAME[_a] = _g


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("nvidia-")


def get_gpu(name: str) -> GPU:
    """Look up a target by catalog name or alias ('h100', 'H100-80GB', 'nvidia_a100'); a MIG slice as
    CARD:PROFILE or CARD-mig-PROFILE ('h100:3g.40gb', 'a100-80gb-mig-1g.10gb')."""
    key = _norm(name)
    if key in _BY_NAME:
        return _BY_NAME[key]
    card_name, sep, profile = key.partition(":") if ":" in key else key.partition("-mig-")
    if sep:
        card = _BY_NAME.get(card_name)
        if card is None:
            raise unknown("GPU", card_name, [g.name for g in CARDS])
        known = dict(PROFILES.get(card.name, ()))
        if profile not in known:
            names = ", ".join(known) or "none"
            raise ConfigError(f"{card.name} has no MIG profile {profile!r} in the catalog (known: {names})")
        return mig_profile(card, profile)
    raise unknown("GPU", name, [g.name for g in DEVICES])


def host_device(memory_gib: float) -> GPU:
    """The host as the device a CPU engine plans on: its memory (GiB, 2^30 bytes) as the OS reports it
    (MemTotal, which vLLM's CPU worker reads as its total). Bandwidth and FLOP/s are a modest server's,
    for the timing models only."""
    if not 0 < memory_gib <= 1 << 20:  # also refuses NaN
        raise ConfigError(f"host memory: must be a positive finite number of GiB, got {memory_gib}")
    return GPU(
        HOST_DEVICE,
        memory_gib,
        memory_gib,
        50,
        1,
        vendor=HOST_VENDOR,
        arch="host",
        memory_source="the host's memory (MemTotal or --host-memory-gib)",
    )


def custom_gpu(memory_gib: float, like: GPU | None = None) -> GPU:
    """A card of a given usable memory, borrowing timing figures from *like* if given."""
    if like is not None:
        return replace(like, memory_gib=memory_gib, memory_source="--gpu-memory-gib")
    return GPU(
        name=f"custom-{memory_gib:g}gib",
        memory_gib=memory_gib,
        nominal_gb=memory_gib,
        bandwidth_gbps=1000,
        bf16_tflops=100,
        memory_source="--gpu-memory-gib",
    )


def capped_gpu(card: GPU, cap_gib: float) -> GPU:
    """A HAMi-style share of a card: the interposer (HAMi-core's libvgpu.so) answers `cuMemGetInfo` with the cap
    as the device's total (HAMi-core PR #81: "directly returns the user-configured limit as *total"), so the
    engines size against the cap; NVML still reports the whole card (vLLM's batch defaults read it)."""
    if not 0 < cap_gib <= card.memory_gib:
        raise ConfigError(
            f"--gpu-memory-limit-gib: must be above 0 and at most the card's {card.memory_gib:g} GiB, got {cap_gib:g}"
        )
    return replace(
        card,
        name=f"{card.name}@{cap_gib:g}gib",
        memory_gib=cap_gib,
        memory_source=f"a {cap_gib:g} GiB cap on the {card.name} (--gpu-memory-limit-gib)",
        aliases=(),
        kind=CAPPED,
        nvml_memory_gib=card.defaults_memory_gib,
        parent=card.name,
    )
