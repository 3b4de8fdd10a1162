"""One planning target: a card, a MIG slice, a capped share of a card or a unified-memory machine.

`memory_gib` is what the engine reads as the device's total (`cudaMemGetInfo` / `torch.cuda.mem_get_info()[1]`,
vLLM's `total_gpu_memory`; ROCm's `hipMemGetInfo`; Metal's `recommendedMaxWorkingSetSize`), not the marketing
number: an "80 GB" H100 shows 79.19 GiB, an L40S "48 GB" 44.39 GiB. Planners that use the nominal figure
over-predict the KV cache by util x the difference on every row.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlab.units import GIB

DISCRETE, UNIFIED, MIG, CAPPED = "discrete", "unified", "mig", "capped"
KINDS = (DISCRETE, UNIFIED, MIG, CAPPED)
# Metal serves llama.cpp and Ollama; vLLM, SGLang, TGI and transformers' serving path need CUDA or ROCm.
METAL_ENGINES = ("llama.cpp", "ollama")
# The host as a planning target: a CPU engine (vLLM's CPU build, llama.cpp with no GPU layers, transformers on the CPU).
HOST_VENDOR = "cpu"
HOST_DEVICE = "cpu"  # the host device's name in a plan (`gpu` in its JSON)
HOST_NAMES = ("cpu", "host")  # what --gpu takes for the host


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float  # as the framework reports it (GiB, 2^30 bytes)
    nominal_gb: float  # the marketing figure
    bandwidth_gbps: float  # HBM/GDDR/LPDDR bandwidth, GB/s (1e9)
    bf16_tflops: float  # dense bf16/fp16 tensor throughput, TFLOP/s (no sparsity)
    vendor: str = "nvidia"  # nvidia | amd | apple | cpu (the host)
    arch: str = ""
    fp8: bool = False
    memory_source: str = ""  # where memory_gib was observed, or how it was estimated
    aliases: tuple[str, ...] = ()
    kind: str = (
        DISCRETE  # discrete | unified (one memory with the OS) | mig (a MIG slice) | capped (a HAMi cap)
    )
    nvswitch: bool | None = None  # on an NVSwitch node; None = from the name (SXM families), as before
    system_memory_gib: float = 0.0  # unified: the machine's memory the GPU shares with the OS
    os_reserved_gib: float = 0.0  # unified: what the OS and its services held at start in published logs
    # What vLLM's batch defaults read (`get_device_total_memory`: NVML's total); None = memory_gib. 0 = NVML
    # cannot read it (unified memory: vLLM's `except Exception: device_memory = 0`), a MIG slice or a capped
    # share: the whole card NVML reports.
    nvml_memory_gib: float | None = None
    parent: str = ""  # mig / capped: the card it is carved from
    engines: tuple[str, ...] = ()  # the engines that run on it; () = every engine

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def os_reserved_bytes(self) -> int:
        return int(self.os_reserved_gib * GIB)

    @property
    def is_a100(self) -> bool:
        return self.name.startswith("a100")

    @property
    def is_host(self) -> bool:
        """The host's memory, not a card: a CPU engine. No CUDA context; the engine's runtime is a term of its own."""
        return self.vendor == HOST_VENDOR

    @property
    def defaults_memory_gib(self) -> float:
        """The device total vLLM's batch defaults compare with 70 GiB."""
        return self.memory_gib if self.nvml_memory_gib is None else self.nvml_memory_gib

    @property
    def unified(self) -> bool:
        return self.kind == UNIFIED
