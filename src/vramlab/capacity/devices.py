"""What a planning target other than a whole discrete card changes: who may run there, the memory the OS or a
sharing layer keeps, and the warnings a plan owes the user (docs/capacity-model.md, "Unified memory and
partitions").

- unified memory (DGX Spark, Jetson, Strix Halo, Apple): the OS's share is memory held before the engine starts
  (`GPU.os_reserved_gib`, replaced by --other-processes-gib); each engine reads the shared pool its own way;
- MIG slices: the instance's memory, no CUDA IPC between instances, vLLM's defaults from NVML's whole card;
- a HAMi-style cap (`gpus.capped_gpu`): the cap is the total the process reads, NVML still the whole card;
- an MPS pinned-memory limit (`EngineSettings.mps_memory_limit_bytes`): allocations fail above it, but the legacy
  limit does not change the total the process reads, so vLLM's utilization stays a share of the whole card.
"""

from __future__ import annotations

from collections.abc import Callable

from vramlab.capacity.estimate import Component
from vramlab.capacity.gpu_spec import CAPPED, GPU, MIG, UNIFIED
from vramlab.capacity.settings import EngineSettings
from vramlab.errors import ConfigError
from vramlab.units import gib

# The non-KV terms a vLLM start-up holds while it profiles, whatever its utilization says.
PROFILE_TERMS = ("cuda_context", "nccl", "weights", "activation_peak", "non_torch")


def check_target(gpu: GPU, settings: EngineSettings) -> None:
    """Refuse an engine that does not run on the target (vLLM, SGLang, TGI and transformers on Metal)."""
    if gpu.engines and settings.engine not in gpu.engines:
        raise ConfigError(
            f"{settings.engine} does not run on {gpu.name} (Metal): plan it with --engine "
            + " or ".join(gpu.engines)
        )


def held_before_start(gpu: GPU, settings: EngineSettings) -> int:
    """Memory other processes hold on the device when the engine starts: what --other-processes-gib says, else on a
    unified machine the share its OS and services held in published start-ups."""
    return max(0, settings.other_processes_bytes) or (gpu.os_reserved_bytes if gpu.kind == UNIFIED else 0)


def page_cache_band_bytes(gpu: GPU, settings: EngineSettings, weights_bytes: int) -> int:
    """How far vLLM's non-torch figure can grow on NVIDIA unified memory: its profile reads the device's used memory
    off cudaMemGetInfo, whose free figure is the kernel's MemFree there (vllm-project/vllm#48140), so page cache the
    loader adds between the start-up snapshot and the profile's end (the checkpoint read from disk, up to its size
    per GPU) counts as vLLM's own memory and comes off the pool. A band term, never a planned value: a checkpoint
    already in the page cache adds nothing."""
    if gpu.kind != UNIFIED or gpu.vendor != "nvidia" or settings.engine != "vllm":
        return 0
    return max(0, weights_bytes)


def device_notes(
    gpu: GPU, settings: EngineSettings, components: tuple[Component, ...], budget: int, other: int
) -> tuple[str, ...]:
    """The plan notes a target other than a whole discrete card owes the user, in the engine's own terms."""
    if gpu.kind == UNIFIED:
        return _unified_notes(gpu, settings, components, budget, other)
    if gpu.kind == MIG:
        return _mig_notes(gpu, settings)
    if gpu.kind == CAPPED:
        return _capped_notes(gpu, settings, budget)
    return ()


def _unified_notes(
    gpu: GPU, settings: EngineSettings, components: tuple[Component, ...], budget: int, other: int
) -> tuple[str, ...]:
    if gpu.vendor == "apple":
        return (
            f"unified memory (Metal): {gpu.memory_gib:g} GiB is Metal's recommendedMaxWorkingSetSize on "
            f"{gpu.system_memory_gib:g} GB (2/3 of the memory up to 32 GB, 3/4 above, on macOS 14-15), the device "
            "llama.cpp and Ollama see; macOS 26 reports more (107.52 GiB of 128 on an M5 Max) and `sudo sysctl "
            "iogpu.wired_limit_mb=N` sets it to N MiB (antirez/ds4#893): plan such a Mac with --gpu-memory-gib",
        )
    if gpu.vendor == "amd":
        return (
            f"unified memory (ROCm carve-out): the BIOS carve-out is the {gpu.memory_gib:g} GiB device ROCm reports "
            f"and the OS keeps the other {gpu.system_memory_gib:g} GiB; layers that do not fit the carve-out go to "
            "the CPU, not to the rest of the memory. With a small carve-out and a large GTT (amdgpu.gttsize / "
            "ttm.pages_limit) llama.cpp and Ollama allocate system memory instead: plan with --gpu-memory-gib the "
            "GTT size. vLLM's utilization on ROCm unified memory has run the host into swap "
            "(kyuz0/amd-strix-halo-vllm-toolboxes#65)",
        )
    notes = [
        f"unified memory: the GPU and the OS share {gpu.system_memory_gib:g} GiB; {gib(other, unit=True)} is planned as held "
        "by the OS and its services before the engine starts"
        + (
            " (--other-processes-gib)"
            if settings.other_processes_bytes
            else (
                " (what published start-ups on this machine found held; --other-processes-gib replaces it)"
                if gpu.os_reserved_gib
                else " (not measured for this machine: pass --other-processes-gib, what `free` shows used)"
            )
        )
    ]
    by_engine = _UNIFIED_BY_ENGINE.get(settings.engine)
    if by_engine is not None:
        notes.extend(by_engine(gpu, settings, components, budget, other))
    return tuple(notes)


def _vllm_unified(
    gpu: GPU, settings: EngineSettings, components: tuple[Component, ...], budget: int, other: int
) -> list[str]:
    total = gpu.memory_bytes
    peak = sum(c.bytes for c in components if c.name in PROFILE_TERMS)
    left = total - other
    out = [
        f"vLLM's --gpu-memory-utilization is a share of the whole {gpu.memory_gib:g} GiB, the OS's share included: "
        f"util x total = {gib(budget, unit=True)} leaves {gib(total - budget, unit=True)} for the OS and every other process; vLLM "
        "reserves nothing for the OS",
        f"vLLM's budget is not a limit while it profiles: the profile holds the weights, the activation peak and "
        f"non-torch memory ({gib(peak, unit=True)} here) whatever the utilization, and on unified memory an overshoot takes "
        "the host's memory and can lock the machine up (vllm-project/vllm#46307, #56824)"
        + (f"; WARNING: that peak exceeds the {gib(left, unit=True)} the OS leaves" if peak > left else ""),
        "vLLM's start-up check compares util x total with cudaMemGetInfo's free memory, which on unified memory "
        "is the kernel's MemFree: page cache (the weights just read, an earlier attempt) counts as used and a "
        "start that fits is refused ('Free memory on device ... is less than desired GPU memory utilization'); "
        "drop the page cache first (sync; echo 3 > /proc/sys/vm/drop_caches) (vllm-project/vllm#48140)",
    ]
    if gpu.nvml_memory_gib == 0:
        out.append(
            "vLLM reads the device's total through NVML for its batch defaults and NVML cannot report unified "
            "memory: it takes the small-card defaults (256 sequences, 2048 batched tokens), as DGX Spark and "
            "Jetson Thor start-ups print"
        )
    return out


def _sglang_unified(*_: object) -> list[str]:
    return [
        "SGLang sizes its pool from the memory free at start-up: on unified memory that figure is psutil's "
        "available memory where SGLang checks `is_integrated` (the code quoted in ollama/ollama#12283), else "
        "cudaMemGetInfo's MemFree, which counts the page cache as used"
    ]


def _llamacpp_unified(*_: object) -> list[str]:
    return [
        "llama.cpp reads MemAvailable for unified-memory CUDA devices (ggml_backend_cuda_get_available_uma_memory, "
        "ggml-org/llama.cpp PR #17368, November 2025): --fit keeps its margin against what the OS leaves"
    ]


def _ollama_unified(*_: object) -> list[str]:
    return [
        "Ollama before v0.30 reads cuMemGetInfo's free memory, MemFree on unified memory, so the page cache counts "
        "as used and fewer layers are offloaded (ollama/ollama#12283); from v0.30 llama-server's --fit reads "
        "MemAvailable"
    ]


_UNIFIED_BY_ENGINE: dict[str, Callable[..., list[str]]] = {
    "vllm": _vllm_unified,
    "sglang": _sglang_unified,
    "llama.cpp": _llamacpp_unified,
    "ollama": _ollama_unified,
}


def _mig_notes(gpu: GPU, settings: EngineSettings) -> tuple[str, ...]:
    profile = gpu.name.split(":", 1)[1]
    notes = [
        f"MIG {profile} of the {gpu.parent}: the instance reports {gpu.memory_gib:g} GiB, what `nvidia-smi mig "
        "-lgip` lists for it; there is no CUDA IPC between MIG instances, so no NVLink or NVSwitch between slices"
    ]
    if settings.engine == "vllm":
        notes.append(
            f"vLLM's batch defaults read NVML by device index, which names the whole {gpu.parent} "
            f"({gpu.defaults_memory_gib:g} GiB); with a MIG UUID in CUDA_VISIBLE_DEVICES that lookup fails and "
            "vLLM takes the small-card defaults (256 sequences, 2048 batched tokens): --max-num-seqs and "
            "--max-num-batched-tokens pin them"
        )
    return tuple(notes)


def _capped_notes(gpu: GPU, settings: EngineSettings, budget: int) -> tuple[str, ...]:
    notes = [
        f"a {gpu.memory_gib:g} GiB cap on the {gpu.parent}: HAMi-core answers cuMemGetInfo with the cap as the "
        "device's total (Project-HAMi/HAMi-core PR #81), so the engines size against the cap; NVML still reports "
        f"the whole card ({gpu.defaults_memory_gib:g} GiB: nvidia-smi, vLLM's batch defaults), and allocations "
        "HAMi-core does not intercept are not counted against the cap (Project-HAMi/HAMi-core#79)"
    ]
    if settings.engine == "vllm":
        notes.append(
            f"vLLM's --gpu-memory-utilization is a share of the cap: util x cap = {gib(budget, unit=True)}; its CUDA-graph "
            "memory profiling ignores the clamp and has run out of memory under it (vllm-project/vllm#40937): "
            "leave room under the cap or profile without graphs (--enforce-eager)"
        )
    return tuple(notes)


def mps_limit(gpu: GPU, settings: EngineSettings, used: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(notes, refusals) for an MPS pinned-device-memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)."""
    limit = settings.mps_memory_limit_bytes
    if not limit:
        return (), ()
    notes = (
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT lets this client allocate {gib(limit, unit=True)}, but the legacy limit does not "
        f"change the device total the process reads (NVIDIA/k8s-device-plugin#764: PyTorch saw the whole L40S under "
        f"a 4606M limit): engines that size from the total still see {gpu.memory_gib:g} GiB"
        + (
            f"; vLLM's --gpu-memory-utilization stays a share of it: at most {limit / gpu.memory_bytes:.2f} keeps "
            "the budget under the limit (or pass --kv-cache-memory-bytes)"
            if settings.engine == "vllm"
            else ""
        ),
    )
    refusals = (
        (
            f"the process holds {gib(used, unit=True)}, above the MPS limit of {gib(limit, unit=True)}: allocations beyond it fail "
            "(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)",
        )
        if used > limit
        else ()
    )
    return notes, refusals
