"""Unified-memory machines: the GPU and the operating system share one memory.

What "the device's total" means differs by platform, and the catalog records what the engines read:
- NVIDIA GB10 (DGX Spark) and Jetson: `cudaMemGetInfo`'s total is the whole system memory (MemTotal); the OS,
  its services and the page cache take their share from the same pool (`os_reserved_gib`: what published
  start-ups found held before the engine started). NVML cannot report their memory
  (`nvmlDeviceGetMemoryInfo` is not supported), so vLLM's batch defaults see 0 GiB (`nvml_memory_gib=0`).
- AMD Strix Halo (Ryzen AI Max+ 395, 128 GB): ROCm reports the BIOS carve-out as the device ("64.0 GiB" with a
  64 GB carve-out, r262's Ollama log); the rest is the OS's.
- Apple M-series: Metal's `recommendedMaxWorkingSetSize` is the device llama.cpp and Ollama see ("using device
  MTL0 (Apple M1 Pro) - 10922 MiB free" beside recommendedMaxWorkingSetSize = 11453.25 MB on 16 GB): 2/3 of
  the memory up to 32 GB, 3/4 from 36 GB in the llama.cpp logs of macOS 14-15 (16 GB 11453.25 MB, 32 GB
  22906.50 MB, 36 GB 28991.03 MB, 64 GB 51539.61 MB, 128 GB 103079.22 MB); macOS 26 reports more (107.52 GiB
  of 128 on an M5 Max, antirez/ds4#893) and `sudo sysctl iogpu.wired_limit_mb=N` sets it to N MiB (112.00
  GiB with 114688, the same thread). Only llama.cpp and Ollama run there.
"""

from __future__ import annotations

from vramlab.capacity.gpu_spec import GPU, METAL_ENGINES, UNIFIED

_SPARK_OS = (
    "8.48 GiB held before the engine: 'Free memory on device (113.15/121.63 GiB)' in a DGX Spark vLLM 0.26 "
    "start-up (vllm-project/vllm#44740); 11.3 GiB (110.37/121.69) and ~19.5 GiB (101.3-102.2/121.69) on "
    "other installs (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47)"
)

NVIDIA_UNIFIED: tuple[GPU, ...] = (
    GPU(
        "dgx-spark",
        121.69,
        128,
        273,
        62.5,
        arch="blackwell",
        fp8=True,
        memory_source="'Free memory on device (110.37/121.69 GiB)' in a DGX Spark vLLM start-up "
        "(MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47); torch total_memory 130,663,231,488 B",
        aliases=("gb10", "nvidia-gb10", "dgx-spark-gb10"),
        kind=UNIFIED,
        nvswitch=False,
        system_memory_gib=121.69,
        os_reserved_gib=8.48,
        nvml_memory_gib=0.0,
    ),
    GPU(
        "jetson-agx-thor",
        122.80,
        128,
        273,
        129,
        arch="blackwell",
        fp8=True,
        memory_source="llama.cpp on a Jetson Thor: 'Device 0: NVIDIA Thor, compute capability 11.0, VMM: yes, "
        "VRAM: 125748 MiB' (find_string file id 68871145596)",
        aliases=("jetson-thor", "thor", "jetson-t5000"),
        kind=UNIFIED,
        nvswitch=False,
        system_memory_gib=122.80,
        nvml_memory_gib=0.0,
    ),
    GPU(
        "jetson-agx-orin-64gb",
        61.35,
        64,
        204.8,
        42.5,
        arch="ampere",
        memory_source="llama.cpp on an AGX Orin 64GB: 'Device 0: Orin, compute capability 8.7, VMM: yes, VRAM: "
        "62827 MiB' (find_string file id 58111358145)",
        aliases=("jetson-agx-orin", "agx-orin-64gb", "orin-64gb"),
        kind=UNIFIED,
        nvswitch=False,
        system_memory_gib=61.35,
    ),
    GPU(
        "jetson-agx-orin-32gb",
        30.68,
        32,
        204.8,
        27,
        arch="ampere",
        memory_source="estimated: the AGX Orin 64GB's share of its memory the kernel reports (62,827 of 65,536 "
        "MiB) applied to 32 GB",
        aliases=("agx-orin-32gb", "orin-32gb"),
        kind=UNIFIED,
        nvswitch=False,
        system_memory_gib=30.68,
    ),
)

_STRIX = "AMD Ryzen AI Max+ 395 (Strix Halo, Radeon 8060S gfx1151), 128 GB LPDDR5X"
AMD_UNIFIED: tuple[GPU, ...] = (
    GPU(
        "strix-halo-64g",
        64.0,
        64,
        256,
        59,
        vendor="amd",
        arch="rdna3.5",
        memory_source=_STRIX + ', 64 GB BIOS carve-out: ROCm \'total="64.0 GiB" available="63.8 GiB"\' and '
        "system memory 62.6 GiB in Ollama 0.11.10's log (benchmarks r262)",
        aliases=("strix-halo", "ryzen-ai-max-395", "ryzen-ai-max-395-64g"),
        kind=UNIFIED,
        system_memory_gib=62.6,
    ),
    GPU(
        "strix-halo-96g",
        96.0,
        96,
        256,
        59,
        vendor="amd",
        arch="rdna3.5",
        memory_source=_STRIX + ", 96 GB BIOS carve-out: 'amdgpu: 98304M of VRAM memory ready' "
        "(ROCm/legacy-rocm-build#5902), Ollama 'total=\"96.0 GiB\"' (ollama/ollama#16462)",
        aliases=("ryzen-ai-max-395-96g",),
        kind=UNIFIED,
        system_memory_gib=30.6,
    ),
)


def _apple(chip: str, memory_gb: int, bandwidth_gbps: float, tflops: float) -> GPU:
    """Metal's recommendedMaxWorkingSetSize on macOS 14-15: 2/3 of the memory up to 32 GB, 3/4 above."""
    share = 2 / 3 if memory_gb <= 32 else 3 / 4
    return GPU(
        f"apple-{chip}-{memory_gb}gb",
        round(memory_gb * share, 2),
        memory_gb,
        bandwidth_gbps,
        tflops,
        vendor="apple",
        arch="apple-silicon",
        memory_source=f"Metal recommendedMaxWorkingSetSize: {'2/3' if share < 0.7 else '3/4'} of {memory_gb} GB "
        "as llama.cpp logs print it on macOS 14-15 (higher on macOS 26; iogpu.wired_limit_mb sets it)",
        kind=UNIFIED,
        system_memory_gib=float(memory_gb),
        engines=METAL_ENGINES,
    )


# (chip, the memory sizes Apple sold it with, bandwidth GB/s, GPU fp16/fp32 TFLOP/s of the largest GPU bin)
_APPLE_CHIPS = (
    ("m2-max", (32, 64, 96), 400, 13.6),
    ("m2-ultra", (64, 128, 192), 800, 27.2),
    ("m3-max", (36, 48, 64, 96, 128), 400, 16.4),
    ("m3-ultra", (96, 256, 512), 819, 28.4),
    ("m4-max", (36, 48, 64, 128), 546, 18.4),
)
APPLE: tuple[GPU, ...] = tuple(
    _apple(chip, size, bw, tflops) for chip, sizes, bw, tflops in _APPLE_CHIPS for size in sizes
)

UNIFIED_MACHINES: tuple[GPU, ...] = NVIDIA_UNIFIED + AMD_UNIFIED + APPLE
