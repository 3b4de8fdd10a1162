"""GPU catalog: memory as the framework sees it, plus bandwidth and FLOP/s for timing models.

`memory_gib` is `torch.cuda.mem_get_info()[1]` / vLLM's `total_gpu_memory`, not the marketing
number: an "80 GB" H100 shows 79.19 GiB. Planners that use the nominal figure over-predict
KV cache by util x the difference on every row (docs/research/llm-d-planner-anchor.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlab.errors import unknown
from vramlab.units import GIB


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float  # as the framework reports it (GiB, 2^30 bytes)
    nominal_gb: float  # the marketing figure
    bandwidth_gbps: float  # HBM/GDDR bandwidth, GB/s (1e9)
    bf16_tflops: float  # dense bf16/fp16 tensor throughput, TFLOP/s (no sparsity)
    vendor: str = "nvidia"
    arch: str = ""
    fp8: bool = False
    memory_source: str = ""  # where memory_gib was observed
    aliases: tuple[str, ...] = ()

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def is_a100(self) -> bool:
        return self.name.startswith("a100")

    @property
    def is_host(self) -> bool:
        """The host's memory, not a card: a CPU engine (vLLM's CPU build, llama.cpp with no GPU layers,
        transformers on the CPU). No CUDA context; the engine's runtime is a term of its own."""
        return self.vendor == HOST_VENDOR


HOST_VENDOR = "cpu"
HOST_DEVICE = "cpu"  # the host device's name in a plan (`gpu` in its JSON)
HOST_NAMES = ("cpu", "host")  # what --gpu takes for the host

_OBS_VLLM = "vLLM total_gpu_memory in published start-up logs"
_EST = "estimated: nominal capacity less the driver reservation seen on sibling cards"

GPUS: tuple[GPU, ...] = (
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
    GPU("rtx-3070", 7.63, 8, 448, 41, arch="ampere", memory_source=_EST, aliases=("3070",)),
    GPU("rtx-3090", 23.69, 24, 936, 71, arch="ampere", memory_source=_EST, aliases=("3090",)),
    GPU("rtx-4090", 23.63, 24, 1008, 165, arch="ada", fp8=True, memory_source=_OBS_VLLM, aliases=("4090",)),
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
    GPU("mi300x", 191.69, 192, 5300, 1307, vendor="amd", arch="cdna3", fp8=True, memory_source=_EST),
    GPU("mi210", 63.98, 64, 1600, 181, vendor="amd", arch="cdna2", memory_source=_EST),
    GPU(
        "mi250", 63.98, 64, 1600, 181, vendor="amd", arch="cdna2", memory_source=_EST, aliases=("mi250x",)
    ),  # per GCD: one MI250 is two 64 GB devices
    GPU("mi325x", 255.98, 256, 6000, 1307, vendor="amd", arch="cdna3", fp8=True, memory_source=_EST),
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

_BY_NAME: dict[str, GPU] = {}
for _g in GPUS:
    _BY_NAME[_g.name] = _g
    for _a in _g.aliases:
        _BY_NAME[_a] = _g


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("nvidia-")


def get_gpu(name: str) -> GPU:
    """Look up a card by catalog name or alias ('h100', 'H100-80GB', 'nvidia_a100')."""
    key = _norm(name)
    if key in _BY_NAME:
        return _BY_NAME[key]
    raise unknown("GPU", name, [g.name for g in GPUS])


def host_device(memory_gib: float) -> GPU:
    """The host as the device a CPU engine plans on: its memory (GiB, 2^30 bytes) as the OS reports it
    (MemTotal, which vLLM's CPU worker reads as its total). Bandwidth and FLOP/s are a modest server's,
    for the timing models only."""
    if not 0 < memory_gib <= 1 << 20:  # also refuses NaN
        from vramlab.errors import ConfigError

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
    base = like or GPU("custom", memory_gib, memory_gib, 1000, 100)
    return GPU(
        name=f"{base.name}" if like else f"custom-{memory_gib:g}gib",
        memory_gib=memory_gib,
        nominal_gb=base.nominal_gb if like else memory_gib,
        bandwidth_gbps=base.bandwidth_gbps,
        bf16_tflops=base.bf16_tflops,
        vendor=base.vendor,
        arch=base.arch,
        fp8=base.fp8,
        memory_source="--gpu-memory-gib",
    )
