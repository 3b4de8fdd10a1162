"""llama.cpp logs (docs/research/capacity-anchors.md section 3), old and new prefixes.

Per device (`CUDA0`, `ROCm1`, `Vulkan0`, `Metal`): model buffer (weights), KV buffer (summed
when an iSWA model prints one per cache), compute buffer (the graph's activation peak). Host
buffers (`CPU`, `CPU_Mapped`, `CUDA_Host`) are not GPU memory and are kept in `extra` only.
The `--fit` dry run's projection is an estimate and kept in `extra`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from vramlab.logs import devices, llamacpp_model
from vramlab.logs.base import Rule, assemble, command_flags, mib, parse_lines, rule

ENGINE = "llama.cpp"
_DEV = r"(?P<dev>(?:CUDA|ROCm|Vulkan|SYCL|MUSA|CANN)\d+|Metal|MTL\d*)"


def _rank(dev: str) -> int:
    m = re.search(r"(\d+)$", dev)
    return int(m.group(1)) if m else 0


def _device_buffer(field: str) -> Callable[[re.Match[str]], dict[str, Any]]:
    def extract(m: re.Match[str]) -> dict[str, Any]:
        return {field: mib(m.group("size")), "_rank": f"rank={_rank(m.group('dev'))}"}

    return extract


_FLAGS = (
    (("-c", "--ctx-size", "--ctx_size", "--n_ctx"), "settings.ctx_size", int),
    (("-np", "--parallel"), "settings.parallel", int),
    (("-ub", "--ubatch-size"), "settings.n_ubatch", int),
    (("-ngl", "--n-gpu-layers", "--n_gpu_layers", "--gpu-layers"), "extra.n_gpu_layers", int),
    (("-ts", "--tensor-split"), "extra.tensor_split", str),
    (("-sm", "--split-mode"), "settings.split_mode", str),
    (("-mg", "--main-gpu"), "settings.main_gpu", int),
    (("-ncmoe", "--n-cpu-moe"), "settings.n_cpu_moe", int),
    (("-ctv", "--cache-type-v"), "settings.cache_type_v", str),
)


def _flags(text: str) -> dict[str, Any]:
    """The placement and context flags of a llama.cpp command line (common/arg.cpp spellings)."""
    out = command_flags(text, _FLAGS, value=r"-?[\w.,]+")
    ot = re.findall(r"(?:^|\s)(?:-ot|--override-tensor)[= ](\"[^\"]*\"|'[^']*'|\S+)", text)
    if ot:
        out["extra.override_tensor"] = [v.strip("'\"") for v in ot]
    if re.search(r"\s(?:-fa|--flash-attn)(?:\s+on)?(?:\s|$)", text):
        out["settings.flash_attn"] = True
    if re.search(r"\s(?:-cmoe|--cpu-moe)(?:\s|$)", text):
        out["extra.cpu_moe"] = True
    if re.search(r"\s(?:-nkvo|--no-kv-offload)(?:\s|$)", text):
        out["settings.no_kv_offload"] = True
    if re.search(r"\s--no-mmap(?:\s|$)", text):
        out["settings.mmap"] = False
    return out


def _command(m: re.Match[str]) -> dict[str, Any]:
    text = m.group(0)
    out: dict[str, Any] = {}
    model = re.search(r"(?:^|\s)(?:-m|--model)[= ](\S+)", text)
    if model:
        out["extra.model_path"] = model.group(1).strip("'\"")
    return out | _flags(text)


def _continued(m: re.Match[str]) -> dict[str, Any] | None:
    """A command pasted over several lines (`    -ot ".ffn_.*_exps.=CPU" \\`): each line read on its own."""
    text = " " + m.group(0)
    out = _flags(text)
    model = re.search(r"(?:^|\s)(?:-m|--model)[= ](\S+)", text)
    if model:
        out["extra.model_path"] = model.group(1).strip("'\"")
    return out or None


def _kv_summary(m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "extra.kv_total_bytes": mib(m.group("size")),
        "settings.kv_cache_dtype": m.group("ktype"),
    }
    if m.group("cells"):
        out["extra.kv_cells"] = int(m.group("cells"))
        out["extra.kv_streams"] = int(m.group("seqs")) if m.group("seqmax") else 1
    seq_max = m.group("seqmax") or m.group("seqs")
    if seq_max:
        out["settings.parallel"] = int(seq_max)
    return out


RULES: list[Rule] = (
    [
        rule(
            "build",
            r"^(?:main: )?build(?: info)?: (\d+) \(",
            lambda m: {"engine_version": f"b{m.group(1)}"},
            starts=True,
            shared=True,
        ),
        rule(
            "device_free",
            rf"using device {_DEV} \((?P<name>[^)]*)\).*? - (?P<free>\d+) MiB free",
            lambda m: {
                "free_gpu_memory_bytes": mib(m.group("free")),
                "gpu": m.group("name"),
                "_rank": f"rank={_rank(m.group('dev'))}",
            },
        ),
        rule(
            "cuda_device",
            r"^\s*Device (\d+): ([^,]+), compute capability",
            lambda m: {"gpu": m.group(2).strip(), "_rank": f"rank={m.group(1)}"},
        ),
        rule(
            "model_name",
            r"general\.name\s+(?:str\s+)?=\s+(.+?)\s*$",
            lambda m: {"model": m.group(1)},
            shared=True,
        ),
        # The loader's first line of every model load: a second one after a start-up's memory lines is a
        # restart (a drill's target log, two runs appended), never summed into the first.
        rule(
            "model_path",
            r"loaded meta data with \d+ key-value pairs and \d+ tensors from (\S+)",
            lambda m: {"extra.model_path": m.group(1)},
            starts=True,
            shared=True,
        ),
        rule(
            "model_buffer",
            rf"(?:llm_)?load_tensors:\s+{_DEV} (?:model )?buffer size\s*=\s*(?P<size>[\d.]+) MiB",
            _device_buffer("weights_bytes"),
            once=True,
        ),
        # A pasted command line: llama-server / llama-cli / ./main / ./server, or llama-cpp-python's
        # `python -m llama_cpp.server --model X.gguf --n_ctx N --n_gpu_layers L`.
        rule(
            "command",
            r"(?:llama_cpp\.server|llama-server|llama-cli|\./main|\./server)\b.*",
            _command,
            starts=True,
            shared=True,
        ),
        rule("command_continued", r"^\s+--?[A-Za-z][\w-]*.*", _continued, shared=True, generic=True),
        # 2023 builds: `llm_load_tensors: VRAM used: 124 MB` (MB = MiB), and the host share with the KV
        # cache per state: `mem required  = 3767.53 MB (+ 2000.00 MB per state)`.
        rule(
            "vram_used",
            r"llm_load_tensors: VRAM used: ([\d.]+) MB",
            lambda m: {"weights_bytes": mib(m.group(1)), "_rank": "rank=0"},
            once=True,
        ),
        rule(
            "mem_required",
            r"llm_load_tensors: mem required\s*=\s*([\d.]+) MB(?: \(\+ ([\d.]+) MB per state\))?",
            lambda m: {
                "extra.host_weights_bytes": mib(m.group(1)),
                "extra.kv_per_state_bytes": mib(m.group(2)) if m.group(2) else None,
            },
            shared=True,
        ),
        # Host buffers are not GPU memory; kept apart (CPU offload planning needs them).
        rule(
            "host_model_buffer",
            r"(?:llm_)?load_tensors:\s+(?:CPU|CPU_Mapped|CUDA_Host|Metal_Mapped)(?: model)? buffer size\s*="
            r"\s*([\d.]+) MiB",
            lambda m: {"extra.host_weights_bytes": mib(m.group(1))},
            shared=True,
            accumulate=True,
        ),
        rule(
            "host_output_buffer",
            r":\s+(?:CPU|CUDA_Host)\s+output buffer size\s*=\s*([\d.]+) MiB",
            lambda m: {"extra.host_output_buffer_bytes": mib(m.group(1))},
            shared=True,
        ),
        rule(
            "swa_cells",
            r"creating\s+SWA KV cache, size = (\d+) cells",
            lambda m: {"extra.swa_cells": int(m.group(1))},
            shared=True,
        ),
        rule(
            "kv_buffer",
            rf"llama_kv_cache\w*:\s+{_DEV} KV buffer size\s*=\s*(?P<size>[\d.]+) MiB",
            _device_buffer("kv_cache_bytes"),
            accumulate=True,
        ),
        # `size = X MiB (C cells, L layers, S/N seqs)`: C cells per stream, S sequences, N streams
        # (N = S when the KV is not unified: one stream per sequence, C cells each). Before streams
        # existed the line said `(C cells, L layers, S seqs)` with C the whole cache.
        rule(
            "kv_summary",
            r"(?:KV self size|llama_kv_cache\w*: size)\s*=\s*(?P<size>[\d.]+) MiB"
            r"(?: \(\s*(?P<cells>\d+) cells,\s*\d+ layers,\s*(?:(?P<seqmax>\d+)/)?(?P<seqs>\d+) seqs\))?, K \((?P<ktype>\w+)\)",
            _kv_summary,
            shared=True,
            accumulate=True,
        ),
        rule(
            "host_compute_buffer",
            r"(?:llama_new_context_with_model|llama_init_from_model|llama_context|graph_reserve|"
            r"sched_reserve):\s+(?:CPU|CUDA_Host)\s+compute buffer size\s*=\s*([\d.]+) MiB",
            lambda m: {"extra.host_compute_bytes": mib(m.group(1))},
            shared=True,
            accumulate=True,
        ),
        rule(
            "compute_buffer",
            rf"(?:llama_new_context_with_model|llama_init_from_model|llama_context|graph_reserve|sched_reserve):"
            rf"\s+{_DEV} compute buffer size\s*=\s*(?P<size>[\d.]+) MiB",
            _device_buffer("activation_peak_bytes"),
            accumulate=True,
        ),
        rule(
            "n_ctx",
            r"(?:llama_new_context_with_model|llama_context|llama_init_from_model): n_ctx\s*=\s*(\d+)",
            lambda m: {"settings.ctx_size": int(m.group(1))},
            shared=True,
        ),
        rule(
            "n_ctx_seq",
            r": n_ctx_(?:per_)?seq\s*(?:\(\d+\))?\s*=\s*(\d+)",
            lambda m: {"max_model_len": int(m.group(1))},
            shared=True,
        ),
        rule(
            "n_ctx_seq_train",
            r"n_ctx_(?:per_)?seq \((\d+)\) [<>]=? n_ctx_train \((\d+)\)",
            lambda m: {"max_model_len": int(m.group(1)), "extra.n_ctx_train": int(m.group(2))},
            shared=True,
        ),
        rule(
            "slot_ctx",
            r"Slot \d+ - max context: (\d+)",
            lambda m: {"max_model_len": int(m.group(1))},
            shared=True,
        ),
        rule(
            "kv_unified",
            r"(?:: kv_unified\s*=\s*|kv_unified = ')(true|false)",
            lambda m: {"extra.kv_unified": m.group(1) == "true"},
            shared=True,
        ),
        rule(
            "n_seq_max",
            r": n_seq_max\s*=\s*(\d+)",
            lambda m: {"settings.parallel": int(m.group(1))},
            shared=True,
        ),
        rule(
            "n_ubatch",
            r": n_ubatch\s*=\s*(\d+)",
            lambda m: {"settings.n_ubatch": int(m.group(1))},
            shared=True,
        ),
        rule(
            "flash_attn",
            r": flash_attn\s*=\s*(\w+)",  # 'auto' leaves the choice to llama.cpp: not a setting
            lambda m: {
                "settings.flash_attn": None
                if m.group(1) == "auto"
                else m.group(1) in ("1", "enabled", "true", "on")
            },
            shared=True,
        ),
        rule(
            "fit",
            r"projected to use (\d+) MiB of device memory vs\. (\d+) MiB of free device memory",
            lambda m: {"extra.fit_projected_bytes": mib(m.group(1)), "extra.fit_free_bytes": mib(m.group(2))},
            shared=True,
        ),
        rule(
            "file_type",
            r"(?:file type|model ftype)\s*=\s*(?:all F32|mostly )?\s*(?P<t>[A-Z0-9_]+)(?: - (?P<size>\w+))?",
            lambda m: {"settings.quantization": _ftype(m.group("t"), m.group("size"))},
            shared=True,
        ),
        rule(
            "offloaded",
            r"offloaded (\d+)/(\d+) layers to GPU",
            lambda m: {"extra.layers_offloaded": int(m.group(1)), "extra.layers_total": int(m.group(2))},
            shared=True,
        ),
    ]
    + llamacpp_model.RULES
    + devices.RULES
)


_FILE_TYPE = re.compile(r"[-_.](I?Q[0-9]_[0-9A-Z]+(?:_[0-9A-Z]+)*|BF16|F16|F32|MXFP4)\.gguf$", re.IGNORECASE)


def _ftype(name: str, size: str | None) -> str:
    """'Q4_K' + 'Medium' -> 'Q4_K_M' (llama.cpp prints the file type that way)."""
    if size and name.endswith("_K") and size[:1].upper() in "SML":
        return f"{name}_{size[0].upper()}"
    return name


def parse(lines: Iterable[str]) -> list[Any]:
    startups, _ = parse_lines(lines, RULES)
    return post_process(assemble(ENGINE, startups, finish))


def post_process(observations: list[Any]) -> list[Any]:
    """What a start-up's observations tell each other: the devices the layers were split over (each
    device's name and free memory, for the placement a prediction repeats: logs/cards.py); the GGUF
    file name tells the quantization when the metadata did not print it."""
    by_startup: dict[int | None, list[Any]] = {}
    for o in observations:
        by_startup.setdefault(o.startup, []).append(o)
    for group in by_startup.values():
        ranks = sorted({o.rank for o in group if o.rank is not None})
        if len(ranks) > 1:  # --split-mode layer (the default): each device holds a share of the layers
            seen = {o.rank: o for o in group}
            split = [
                {"index": r, "name": seen[r].gpu, "free_bytes": seen[r].free_gpu_memory_bytes} for r in ranks
            ]
            for o in group:
                o.extra["devices"] = split
    for o in observations:
        path = o.extra.get("model_path")
        if "quantization" not in o.settings and isinstance(path, str):
            found = _FILE_TYPE.search(path.rsplit("/", 1)[-1])
            if found:
                o.settings["quantization"] = found.group(1).upper()
    return observations


def _kv_tokens(fields: dict[str, Any]) -> None:
    """Tokens the KV cache holds. llama.cpp prints `C cells ... S/N seqs` (src/llama-kv-cache.cpp:
    kv_size, n_seq_max, n_stream). Logs show C as the whole cache ('65536 cells, 4/4 seqs' with
    n_ctx 65536, unified) and as one stream's share ('2048 cells, 4/4 seqs' for -c 8192 -np 4, not
    unified), so n_ctx or the kv_unified line decides; without either, N > 1 is left unread."""
    cells, streams = fields.get("extra.kv_cells"), fields.get("extra.kv_streams") or 1
    if cells is None or fields.get("kv_cache_tokens") is not None:
        return
    if streams == 1:
        fields["kv_cache_tokens"] = cells
        return
    n_ctx, unified = fields.get("settings.ctx_size"), fields.get("extra.kv_unified")
    if n_ctx:
        per_stream = abs(cells * streams - n_ctx) < abs(cells - n_ctx)
    elif unified is not None:
        per_stream = not unified
    else:
        return  # "cells per stream or in all": the excerpt does not say
    fields["kv_cache_tokens"] = cells * streams if per_stream else cells
    if per_stream and fields.get("max_model_len") is None:
        fields["max_model_len"] = cells  # a sequence has its own stream's cells, no more


def finish(fields: dict[str, Any]) -> None:
    _kv_tokens(fields)
    # A 2024 log with a single device printed the total KV (`KV self size`) but maybe no
    # per-device line; with one device they are the same memory.
    if fields.get("kv_cache_bytes") is None and fields.get("extra.kv_total_bytes") is not None:
        if fields.get("extra.layers_offloaded") in (None, fields.get("extra.layers_total")):
            fields["kv_cache_bytes"] = fields["extra.kv_total_bytes"]
    if (
        fields.get("max_model_len") is None
        and fields.get("settings.ctx_size")
        and fields.get("settings.parallel")
    ):
        fields["max_model_len"] = fields["settings.ctx_size"] // fields["settings.parallel"]
