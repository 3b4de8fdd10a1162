"""`vramlab plan`'s card options: the target (a catalog card, a MIG slice CARD:PROFILE, a unified machine, a card of
a given memory) and what shares it (other processes, a HAMi-style cap, an MPS memory limit)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from vramlab.units import GIB

if TYPE_CHECKING:
    from vramlab.capacity import GPU

_MAX_GIB = 1 << 20


def add_card_arguments(m: argparse._ArgumentGroup) -> None:
    m.add_argument(
        "--gpu",
        help="catalog GPU name (see `vramlab gpus`), a MIG slice as CARD:PROFILE (h100-80gb:3g.40gb) or a "
        "unified-memory machine (dgx-spark, strix-halo-64g, apple-m4-max-128gb); llama.cpp and Ollama: a list "
        "of cards, e.g. rtx-4090,rtx-5090; cpu: a CPU engine in host memory (vLLM's CPU build, llama.cpp, "
        "transformers; --host-memory-gib)",
    )
    m.add_argument("--gpu-memory-gib", type=float, help="usable memory per GPU for a card not in the catalog")
    m.add_argument(
        "--other-processes-gib",
        type=float,
        default=0.0,
        help="memory other processes hold per GPU (on a unified machine: the OS's share; default the catalog's)",
    )
    m.add_argument(
        "--gpu-memory-limit-gib",
        type=float,
        help="a HAMi-style cap: the total the process reads (CUDA_DEVICE_MEMORY_LIMIT under HAMi-core), GiB",
    )
    m.add_argument(
        "--mps-memory-limit-gib",
        type=float,
        help="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for this client, GiB (allocations fail above it)",
    )


def _gib_option(value: float | None, flag: str) -> float | None:
    from vramlab.errors import ConfigError

    if value is not None and not 0 < value <= _MAX_GIB:  # also refuses NaN
        raise ConfigError(f"{flag}: must be a positive finite number of GiB, got {value}")
    return value


def settings_fields(args: argparse.Namespace) -> dict[str, Any]:
    """EngineSettings fields from the card options."""
    from vramlab.errors import ConfigError

    if not 0 <= args.other_processes_gib <= _MAX_GIB:  # also refuses NaN
        raise ConfigError(
            f"--other-processes-gib: must be a finite number of GiB >= 0, got {args.other_processes_gib}"
        )
    mps = _gib_option(args.mps_memory_limit_gib, "--mps-memory-limit-gib")
    return {
        "other_processes_bytes": int(args.other_processes_gib * GIB),
        "mps_memory_limit_bytes": int(mps * GIB) if mps else 0,
    }


def target(args: argparse.Namespace) -> GPU:
    """The card the plan is for: --gpu (first of a list), --gpu-memory-gib, and a --gpu-memory-limit-gib cap."""
    from vramlab.capacity import capped_gpu, custom_gpu, get_gpu
    from vramlab.errors import ConfigError

    memory = _gib_option(args.gpu_memory_gib, "--gpu-memory-gib")
    cap = _gib_option(args.gpu_memory_limit_gib, "--gpu-memory-limit-gib")
    name = args.gpu.split(",")[0].strip() if args.gpu else None
    if name and memory:
        card = custom_gpu(memory, like=get_gpu(name))
    elif name:
        card = get_gpu(name)
    elif memory:
        card = custom_gpu(memory)
    else:
        raise ConfigError("name a card with --gpu (see `vramlab gpus`) or give --gpu-memory-gib")
    return capped_gpu(card, cap) if cap else card
