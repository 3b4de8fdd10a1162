"""The card (or cards) a start-up ran on, from what its log says.

In order: `--gpu`; the engine's own total (vLLM's `total_memory`, Unsloth's `Max memory`), which
is what the engine budgets from; for Ollama the free memory it decided on; a card the log names
(an engine's device line, nvidia-smi, `collect-env`, TGI's card warning: logs/devices.py),
found in the catalog by its marketing name (`NVIDIA A100-PCIE-40GB` is the catalog's a100-40gb);
nvidia-smi's memory.total of a card the catalog does not know. A llama.cpp start-up over several
devices is planned over those devices, split as llama.cpp split them (logs/llamacpp.py).
"""

from __future__ import annotations

import re
from typing import Any

from vramlab.capacity.gpus import (
    DEVICES,
    DISCRETE,
    GPU,
    GPUS,
    HOST_NAMES,
    UNIFIED,
    custom_gpu,
    get_gpu,
    host_device,
)
from vramlab.errors import ConfigError, VramlabError
from vramlab.logs.observation import Observation
from vramlab.units import GIB, gib

_VENDOR = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct", "intel"}
# Form-factor words a marketing name carries that the catalog does not (its names are memory sizes).
_FORM = re.compile(r"^(?:sxm\d*|pcie|hbm\d*e?|mig|\d+c)$")


def _tokens(name: str) -> list[str]:
    words = re.split(r"[\s_/-]+", name.strip().lower())
    return [w for w in words if w and w not in _VENDOR]


def card_named(name: str, total_bytes: int | None = None) -> GPU | None:
    """The catalog card a log's device name means: the name as it is, without form-factor words,
    then shorter from the end ('RTX 4090 D' -> rtx-4090); among a family's memory sizes the one
    nearest nvidia-smi's total when the name has no size."""
    words = _tokens(name)
    if not words:
        return None
    sized = [w for w in words if not _FORM.match(w)]
    tries = ["-".join(words), "-".join(sized)] + ["-".join(sized[:k]) for k in range(len(sized) - 1, 0, -1)]
    for t in dict.fromkeys(tries):
        if not t or (len(t) < 2 and not any(ch.isdigit() for ch in t)):
            continue
        try:
            found = get_gpu(t)
        except VramlabError:
            continue
        return _nearest_size(found, total_bytes) if not any(w.endswith("gb") for w in sized) else found
    return None


def _nearest_size(card: GPU, total_bytes: int | None) -> GPU:
    """a100 (80 GB in the catalog) for a 40 GB card, when nvidia-smi printed its total."""
    if not total_bytes:
        return card
    family = card.name.split("-", 1)[0]
    # whole cards and unified machines (a Jetson's sizes), not MIG slices or caps of them
    sizes = [
        g
        for g in DEVICES
        if g.kind in (DISCRETE, UNIFIED) and g.name.split("-", 1)[0] == family and g.vendor == card.vendor
    ]
    return min(sizes, key=lambda g: abs(g.nominal_gb * 1e9 - total_bytes)) if sizes else card


def gpu_for(obs: Observation, gpu: str | None = None) -> tuple[GPU, str]:
    """The card to predict for, and why (see the module's order). A CPU engine's log (vLLM's CPU
    build prints the host's memory beside its KV space) is predicted on the host."""
    if obs.extra.get("device") == "cpu" or (gpu or "").strip().lower() in HOST_NAMES:
        return _host_for(obs, gpu)
    if gpu:
        card = get_gpu(gpu)
        return card, f"{card.name} (--gpu)"
    engine_total = obs.total_gpu_memory_bytes or obs.extra.get("framework_total_bytes")
    if isinstance(engine_total, int) and engine_total > 0:
        total_gib = engine_total / GIB
        close = min(GPUS, key=lambda g: abs(g.memory_gib - total_gib))
        if abs(close.memory_gib - total_gib) <= 0.01 * total_gib:
            return custom_gpu(
                total_gib, like=close
            ), f"{close.name} (closest to the log's {total_gib:.2f} GiB total)"
        return custom_gpu(total_gib), f"a {total_gib:.2f} GiB card (the log's total memory)"
    from vramlab.logs.compare import model_engine

    total = obs.extra.get("device_total_bytes")
    named = card_named(obs.gpu, total if isinstance(total, int) else None) if obs.gpu else None
    if (
        model_engine(obs) == "ollama" and obs.free_gpu_memory_bytes
    ):  # Ollama decides on the free memory it logs
        free_gib = obs.free_gpu_memory_bytes / GIB
        return custom_gpu(free_gib, like=named), f"the {free_gib:.2f} GiB Ollama logged as available"
    others = _other_cards(obs, named)
    if others:
        raise ConfigError(
            f"the log lists different cards ({', '.join(others)}) and does not say which one the engine "
            "used; pass --gpu"
        )
    if named is not None:
        return named, f"{named.name} (named in the log: {obs.gpu})"
    if isinstance(total, int) and total > 0:
        gib_total = total / GIB
        return custom_gpu(gib_total), (
            f"a {gib_total:.2f} GiB card (nvidia-smi's total for {obs.gpu or 'the card'}, which the "
            "catalog does not know; CUDA lets a process see a little less)"
        )
    if obs.gpu:
        raise ConfigError(f"the log names the card {obs.gpu!r}, which is not in the catalog; pass --gpu")
    raise ConfigError("the log does not print the GPU's total memory or a known card; pass --gpu")


def _host_for(obs: Observation, gpu: str | None) -> tuple[GPU, str]:
    if gpu and gpu.strip().lower() not in HOST_NAMES:
        raise ConfigError(
            f"--gpu {gpu}: the log is a CPU engine's (host memory); pass --gpu cpu or leave it out"
        )
    total = obs.extra.get("host_memory_bytes") or obs.total_gpu_memory_bytes
    if total:
        return host_device(total / GIB), f"the host ({gib(total, unit=True)}, the log's total memory)"
    from vramlab.sources.host import host_memory_gib

    here = host_memory_gib()
    if here is None:
        raise ConfigError("a CPU engine's log that prints no host memory, and this machine's is not readable")
    where = f"the host ({gib(here * GIB, unit=True)}, this machine's MemTotal: the log prints none)"
    return host_device(here), where


def _other_cards(obs: Observation, named: GPU | None) -> list[str]:
    """nvidia-smi lists every card of the machine: different ones leave the engine's open (a vLLM
    log's ranks do not say which index they ran on)."""
    listed = obs.extra.get("devices_named") or {}
    if obs.engine in ("llama.cpp", "ollama") or not isinstance(listed, dict) or len(set(listed.values())) < 2:
        return []
    return sorted(set(str(v) for v in listed.values()))


def llamacpp_placement(obs: Observation) -> dict[str, Any]:
    """The placement settings a llama.cpp start-up printed: the devices its layers were split over
    (catalog cards by name, else a card of the free memory it printed), the split (`-ts` when the
    command is printed, else each device's free memory, as llama.cpp splits without it:
    src/llama-model.cpp load_tensors), `-ot` and `--n-cpu-moe`, and the layers it offloaded."""
    x: dict[str, Any] = obs.extra
    out: dict[str, Any] = {}
    offloaded, total = x.get("layers_offloaded"), x.get("layers_total")
    if isinstance(offloaded, int) and isinstance(total, int) and offloaded < total:
        out["n_gpu_layers"] = offloaded  # llama.cpp's count: the output layer is one
    if x.get("override_tensor"):
        out["override_tensor"] = tuple(str(p) for p in x["override_tensor"])
    if x.get("cpu_moe"):
        out["n_cpu_moe"] = 1 << 12  # --cpu-moe: every layer's experts (as plan --cpu-moe says it)
    split = x.get("devices")
    if not isinstance(split, list) or len(split) < 2:
        return out
    cards: list[tuple[str, int]] = []
    for dev in split:
        named = card_named(str(dev.get("name") or ""), None)
        free = dev.get("free_bytes")
        if named is not None:
            cards.append((named.name, named.memory_bytes))
        elif isinstance(free, int) and free > 0:
            cards.append((str(dev.get("name") or f"device {dev.get('index')}"), free))
        else:
            return out | {"pipeline_parallel_size": len(split)}  # no card and no size: equal shares
    out["devices"] = tuple(cards)
    given = _tensor_split(x.get("tensor_split"))
    frees = [dev.get("free_bytes") for dev in split]
    if given is not None:
        out["tensor_split"] = given
    elif all(isinstance(f, int) and f > 0 for f in frees):
        out["tensor_split"] = tuple(round(int(f) / (1 << 20), 2) for f in frees)  # MiB, as printed
    return out


def _tensor_split(text: Any) -> tuple[float, ...] | None:
    """`-ts 3,1` (or `3/1`) as proportions; anything else is left to the free memory."""
    if not isinstance(text, str):
        return None
    try:
        values = tuple(float(v) for v in re.split(r"[,/]", text) if v)
    except ValueError:
        return None
    if not values or any(not (v >= 0) or v == float("inf") for v in values) or not any(values):
        return None
    return values


__all__ = ["card_named", "gpu_for", "llamacpp_placement"]
