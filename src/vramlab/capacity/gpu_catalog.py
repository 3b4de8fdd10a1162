"""The discrete cards: memory as the framework sees it, bandwidth and dense bf16 FLOP/s, and where each
memory figure comes from.

Observed figures are the device total an engine printed (vLLM's `total_gpu_memory`, llama.cpp's device
list, PyTorch's "total capacity"). Estimated ones start from the nominal memory, or nvidia-smi's total where
a public output shows it, less what the driver keeps back on a sibling of the same generation whose two
figures are both known: Ampere GeForce 379 MiB (RTX 3060 12 GB: 12,288 MiB, 11.63 GiB in vLLM's error
line, benchmarks r244), Ada 379 MiB (RTX 4090: 24,576 MiB, 23.63 GiB in vLLM logs), GeForce Blackwell
662 MiB (RTX 5090: 32,768 MiB, 32,106 MiB in llama.cpp's device list, ggml-org/llama.cpp#17536), Hopper
468 MiB below nvidia-smi (H100: 81,559 MiB, 79.19 GiB in vLLM logs), datacenter Blackwell 718 MiB below
nvidia-smi (B200: 183,359 MiB, 178.36 GiB in vLLM PR #21489's log).

bf16 TFLOP/s are dense, with fp32 accumulation (GeForce cards run it at half the fp16-accumulate rate):
for Ada GeForce the vendor's "AI TOPS" (fp8, sparse) / 8, for Blackwell GeForce (fp4, sparse) / 16 --
the rule that gives the RTX 4090's 165 and the RTX 5090's 209.5 below.
"""

from __future__ import annotations

from vramlab.capacity.gpu_spec import GPU

_OBS_VLLM = "vLLM total_gpu_memory in published start-up logs"
_EST = "estimated: nominal capacity less the driver reservation seen on sibling cards"
_EST_AMPERE = (
    "estimated: nominal MiB less 379 MiB, the RTX 3060 12 GB's reservation (11.63 GiB in vLLM, r244)"
)
_EST_ADA = "estimated: nominal MiB less 379 MiB, the RTX 4090's reservation (23.63 GiB in vLLM logs)"
_EST_BLACKWELL = (
    "estimated: nominal MiB less 662 MiB, the RTX 5090's reservation (32,106 MiB, llama.cpp#17536)"
)
_LAPTOP = " (laptop part: the same memory; clocks, and so TFLOP/s, vary with the maker's power limit)"

CARDS: tuple[GPU, ...] = (
    # Pascal (compute capability 6.x): llama.cpp and transformers run; vLLM needs 7.0+.
    GPU("p100-16gb", 15.89, 16, 732, 19, arch="pascal", memory_source=_EST, aliases=("p100", "tesla-p100")),
    GPU("p40", 22.38, 24, 346, 12, arch="pascal", memory_source=_EST, aliases=("tesla-p40",)),
    GPU("gtx-1080-ti", 10.91, 11, 484, 11, arch="pascal", memory_source=_EST, aliases=("1080-ti", "1080ti")),
    GPU("rtx-2080-ti", 10.75, 11, 616, 54, arch="turing", memory_source=_EST, aliases=("2080-ti", "2080ti")),
    GPU("titan-rtx", 23.65, 24, 672, 65, arch="turing", memory_source=_EST),
    GPU("quadro-rtx-8000", 47.46, 48, 672, 65, arch="turing", memory_source=_EST, aliases=("rtx-8000",)),
    GPU("t4", 14.74, 16, 320, 65, arch="turing", memory_source=_OBS_VLLM, aliases=("tesla-t4",)),
    GPU("v100-16gb", 15.77, 16, 900, 125, arch="volta", memory_source=_EST, aliases=("v100",)),
    GPU("v100-32gb", 31.74, 32, 900, 125, arch="volta", memory_source=_EST),
    GPU("l4", 22.49, 24, 300, 121, arch="ada", fp8=True, memory_source="kvplan / vLLM logs on L4"),
    GPU(
        "a10g",
        22.19,
        24,
        600,
        70,
        arch="ampere",
        memory_source="PyTorch OOM messages on A10G",
        aliases=("a10",),
    ),
    GPU(
        "rtx-3060",
        11.63,
        12,
        360,
        25.5,
        arch="ampere",
        memory_source="vLLM 0.19 on a desktop RTX 3060 12GB: 11.63 GiB total in its error line (benchmarks r244)",
        aliases=("3060", "rtx-3060-12gb"),
    ),
    GPU("rtx-3070", 7.63, 8, 448, 41, arch="ampere", memory_source=_EST, aliases=("3070",)),
    GPU("rtx-3090", 23.69, 24, 936, 71, arch="ampere", memory_source=_EST, aliases=("3090",)),
    GPU("rtx-3060-laptop", 5.63, 6, 336, 22, arch="ampere", memory_source=_EST_AMPERE + _LAPTOP),
    GPU("rtx-3070-laptop", 7.63, 8, 448, 32, arch="ampere", memory_source=_EST_AMPERE + _LAPTOP),
    GPU("rtx-4060", 7.63, 8, 272, 30.2, arch="ada", fp8=True, memory_source=_EST_ADA, aliases=("4060",)),
    GPU("rtx-4060-ti-8gb", 7.63, 8, 288, 44.1, arch="ada", fp8=True, memory_source=_EST_ADA),
    GPU(
        "rtx-4060-ti-16gb",
        15.63,
        16,
        288,
        44.1,
        arch="ada",
        fp8=True,
        memory_source=_EST_ADA,
        aliases=("rtx-4060-ti", "4060-ti"),
    ),
    GPU("rtx-4070", 11.63, 12, 504, 58.3, arch="ada", fp8=True, memory_source=_EST_ADA, aliases=("4070",)),
    GPU("rtx-4070-super", 11.63, 12, 504, 71, arch="ada", fp8=True, memory_source=_EST_ADA),
    GPU("rtx-4070-ti", 11.63, 12, 504, 80.1, arch="ada", fp8=True, memory_source=_EST_ADA),
    GPU("rtx-4070-ti-super", 15.63, 16, 672, 88.3, arch="ada", fp8=True, memory_source=_EST_ADA),
    GPU(
        "rtx-4080",
        15.63,
        16,
        717,
        97.5,
        arch="ada",
        fp8=True,
        memory_source=_EST_ADA + "; nvidia-smi 16,376 MiB in a public WSL2 note (benchmarks r200)",
        aliases=("4080",),
    ),
    GPU("rtx-4060-laptop", 7.63, 8, 256, 29.1, arch="ada", fp8=True, memory_source=_EST_ADA + _LAPTOP),
    GPU("rtx-4070-laptop", 7.63, 8, 256, 40.1, arch="ada", fp8=True, memory_source=_EST_ADA + _LAPTOP),
    GPU("rtx-4080-laptop", 11.63, 12, 432, 67.8, arch="ada", fp8=True, memory_source=_EST_ADA + _LAPTOP),
    GPU("rtx-4090-laptop", 15.63, 16, 576, 85.8, arch="ada", fp8=True, memory_source=_EST_ADA + _LAPTOP),
    GPU("rtx-4090", 23.63, 24, 1008, 165, arch="ada", fp8=True, memory_source=_OBS_VLLM, aliases=("4090",)),
    GPU("rtx-5060-ti-8gb", 7.35, 8, 448, 47.4, arch="blackwell", fp8=True, memory_source=_EST_BLACKWELL),
    GPU(
        "rtx-5060-ti-16gb",
        15.35,
        16,
        448,
        47.4,
        arch="blackwell",
        fp8=True,
        memory_source=_EST_BLACKWELL,
        aliases=("rtx-5060-ti", "5060-ti"),
    ),
    GPU(
        "rtx-5080",
        15.35,
        16,
        960,
        112.6,
        arch="blackwell",
        fp8=True,
        memory_source=_EST_BLACKWELL + "; nvidia-smi 16,303 MiB in a public log (benchmarks r210)",
        aliases=("5080",),
    ),
    GPU("rtx-5090", 31.36, 32, 1792, 209, arch="blackwell", fp8=True, memory_source=_EST, aliases=("5090",)),
    GPU("rtx-a6000", 47.50, 48, 768, 155, arch="ampere", memory_source=_OBS_VLLM, aliases=("a6000",)),
    GPU(
        "rtx-6000-ada",
        47.50,
        48,
        960,
        364,
        arch="ada",
        fp8=True,
        memory_source=_OBS_VLLM,
        aliases=("6000-ada",),
    ),
    GPU(
        "rtx-pro-6000",
        95.01,
        96,
        1792,
        504,
        arch="blackwell",
        fp8=True,
        memory_source="vLLM 0.27.1 / 0.19 total_gpu_memory on RTX PRO 6000 Blackwell cards (benchmarks r110-r112, r236)",
        aliases=("rtx-pro-6000-blackwell", "rtx-pro-6000-workstation", "rtx-pro-6000-server"),
        nvswitch=False,  # PCIe workstation / server cards
    ),
    GPU(
        "rtx-pro-6000-max-q",
        95.01,
        96,
        1792,
        438,
        arch="blackwell",
        fp8=True,
        memory_source="the RTX PRO 6000 Blackwell's 96 GB at a 300 W limit: the same memory as the 600 W card",
        nvswitch=False,
    ),
    GPU("l40s", 44.39, 48, 864, 362, arch="ada", fp8=True, memory_source=_EST, aliases=("l40",)),
    GPU(
        "a100-40gb",
        39.56,
        40,
        1555,
        312,
        arch="ampere",
        memory_source=_OBS_VLLM,
        aliases=("a100-40g", "a100-sxm4-40gb"),
    ),
    GPU(
        "a100-80gb",
        79.15,
        80,
        2039,
        312,
        arch="ampere",
        memory_source=_OBS_VLLM,
        aliases=("a100", "a100-80g", "a100-sxm4-80gb"),
    ),
    GPU(
        "h100-80gb",
        79.19,
        80,
        3350,
        989,
        arch="hopper",
        fp8=True,
        memory_source=_OBS_VLLM,
        aliases=("h100", "h100-sxm", "h100-80g"),
    ),
    GPU("h100-pcie", 79.19, 80, 2000, 756, arch="hopper", fp8=True, memory_source=_EST),
    GPU("h100-nvl", 93.10, 94, 3900, 835, arch="hopper", fp8=True, memory_source=_EST),
    GPU(
        "h20",
        95.12,
        96,
        4000,
        148,
        arch="hopper",
        fp8=True,
        memory_source="estimated: nvidia-smi 97,871 MiB (a public H20 nvidia-smi output, find_string file id "
        "69446752771) less the H100's 468 MiB between nvidia-smi and CUDA",
        aliases=("h20-96gb",),
        nvswitch=True,  # HGX H20: NVLink / NVSwitch
    ),
    GPU("h200", 139.81, 141, 4800, 989, arch="hopper", fp8=True, memory_source=_EST, aliases=("h200-141gb",)),
    GPU(
        "b200",
        178.36,
        192,
        8000,
        2250,
        arch="blackwell",
        fp8=True,
        memory_source="vLLM PR #21489 log",
        aliases=("b200-180gb",),
    ),
    GPU(
        "gb200",
        184.33,
        186,
        8000,
        2500,
        arch="blackwell",
        fp8=True,
        memory_source="estimated per GPU: nvidia-smi 189,471 MiB (public GB200 nvidia-smi outputs) less the "
        "B200's 718 MiB between nvidia-smi and CUDA",
        aliases=("gb200-nvl72",),
        nvswitch=True,
    ),
    GPU(
        "b300",
        267.89,
        288,
        8000,
        2250,
        arch="blackwell",
        fp8=True,
        memory_source="estimated: nvidia-smi 275,040 MiB (a public B300 SXM6 AC output) less the B200's 718 MiB "
        "between nvidia-smi and CUDA",
        aliases=("b300-sxm6",),
        nvswitch=True,
    ),
    GPU("mi300x", 191.69, 192, 5300, 1307, vendor="amd", arch="cdna3", fp8=True, memory_source=_EST),
    GPU("mi210", 63.98, 64, 1600, 181, vendor="amd", arch="cdna2", memory_source=_EST),
    GPU(
        "mi250", 63.98, 64, 1600, 181, vendor="amd", arch="cdna2", memory_source=_EST, aliases=("mi250x",)
    ),  # per GCD: one MI250 is two 64 GB devices
    GPU("mi325x", 255.98, 256, 6000, 1307, vendor="amd", arch="cdna3", fp8=True, memory_source=_EST),
    GPU(
        "mi355x",
        287.98,
        288,
        8000,
        2517,
        vendor="amd",
        arch="cdna4",
        fp8=True,
        memory_source="estimated like the MI325X: 288 GB of HBM3E less 0.02 GiB",
    ),
    GPU(
        "rx-7900-xtx",
        23.98,
        24,
        960,
        123,
        vendor="amd",
        arch="rdna3",
        memory_source=_EST,
        aliases=("7900-xtx", "radeon-rx-7900-xtx"),
    ),
)
