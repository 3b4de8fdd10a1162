"""`vramlab plan`'s flags turned into one validated EngineSettings: the flags of another engine are refused in one
line, llama.cpp's placement flags parsed as llama.cpp parses them, the cards resolved."""

from __future__ import annotations

import argparse
import math
import re
from typing import TYPE_CHECKING, Any

from vramlab.cli import plan_device
from vramlab.cli.plan_args import ENGINE_FLAGS

if TYPE_CHECKING:
    from vramlab.capacity import GPU, EngineSettings

_NAMES = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "tgi": "TGI",
    "llama.cpp": "llama.cpp",
    "transformers": "transformers",
    "ollama": "Ollama",
}
# Why a flag does not apply, where a one-word engine list would mislead.
_HINTS = {
    "tensor_parallel_size": "llama.cpp and Ollama split layers over cards: name each card with --gpu A,B",
    "pipeline_parallel_size": "llama.cpp and Ollama split layers over cards: name each card with --gpu A,B",
}


def foreign_flags(args: argparse.Namespace) -> list[tuple[str, tuple[str, ...]]]:
    """The flags given that the chosen engine's plan does not read, each with the engines that do."""
    out = []
    for dest, (engines, neutral) in ENGINE_FLAGS.items():
        value = getattr(args, dest, neutral)
        if args.engine in engines or value == neutral or value is None:
            continue
        out.append(("--" + dest.replace("_", "-"), engines))
    return out


def check_engine_flags(args: argparse.Namespace) -> None:
    """One line naming every flag of another engine, and the --engine that reads them all where there is one."""
    from vramlab.errors import ConfigError

    foreign = foreign_flags(args)
    if not foreign:
        return
    said = "; ".join(
        f"{flag} ({_HINTS.get(flag[2:].replace('-', '_')) or ', '.join(_NAMES[e] for e in engines)})"
        for flag, engines in foreign
    )
    common = [e for e in foreign[0][1] if all(e in engines for _, engines in foreign)]
    hinted = any(flag[2:].replace("-", "_") in _HINTS for flag, _ in foreign)
    fix = (
        ""
        if hinted
        else " or add " + " or ".join(f"--engine {e}" for e in common)
        if common
        else " or plan the engine that reads them with --engine"
    )
    raise ConfigError(
        f"{said}: not read by the {_NAMES[args.engine]} plan; drop {'it' if len(foreign) == 1 else 'them'}{fix}"
    )


def check_sweep_keys(engine: str, axes: list[tuple[str, list[Any]]]) -> None:
    """A swept setting the engine does not read would print the same row again and again: refused."""
    from vramlab.errors import ConfigError

    for name, _ in axes:
        engines = ENGINE_FLAGS.get(name, ((engine,), None))[0]
        if engine not in engines:
            raise ConfigError(
                f"--sweep {name.replace('_', '-')}: not read by the {_NAMES[engine]} plan "
                f"({', '.join(_NAMES[e] for e in engines)}); sweep a setting of this engine"
            )


def check_quantizations(settings: EngineSettings, axes: list[tuple[str, list[Any]]], model: Any) -> None:
    """--quantization (and a swept quantization) against the names this engine takes."""
    from vramlab.capacity.quant_names import quantization_problem
    from vramlab.errors import ConfigError

    own = model.quant.method if model.quant is not None else None
    names = [settings.quantization] + [v for n, values in axes if n == "quantization" for v in values]
    for name in names:
        problem = quantization_problem(settings.engine, name, own)
        if problem:
            raise ConfigError(problem)


def settings_of(args: argparse.Namespace) -> EngineSettings:
    """The flags as one validated EngineSettings (check_engine_flags first)."""
    check_engine_flags(args)
    from vramlab.capacity import EngineSettings
    from vramlab.capacity.planning import parse_bytes, parse_count, parse_mm_limits
    from vramlab.capacity.validation import check_settings
    from vramlab.cli import plan_options
    from vramlab.errors import ConfigError

    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError(f"--concurrency: must be at least 1, got {args.concurrency}")

    def count(v: str | None) -> int | None:
        return parse_count(v) if v is not None else None

    return check_settings(
        EngineSettings(
            engine=args.engine,
            engine_version=args.engine_version,
            vllm_engine=args.vllm_engine,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=None if _auto(args.max_model_len) else count(args.max_model_len),
            max_model_len_auto=_auto(args.max_model_len),
            max_num_seqs=count(args.max_num_seqs),
            max_num_batched_tokens=count(args.max_num_batched_tokens),
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            dtype=args.dtype,
            kv_cache_dtype=args.kv_cache_dtype,
            quantization=args.quantization,
            enforce_eager=args.enforce_eager,
            block_size=args.block_size,
            kv_cache_memory_bytes=parse_bytes(args.kv_cache_memory) if args.kv_cache_memory else None,
            num_gpu_blocks_override=count(args.num_gpu_blocks_override),
            mem_fraction_static=args.mem_fraction_static,
            chunked_prefill_size=args.chunked_prefill_size,
            max_batch_prefill_tokens=args.max_batch_prefill_tokens,
            ctx_size=count(args.ctx_size),
            parallel=args.parallel,
            api_server=not (args.llm_class or args.in_trainer),
            in_trainer=args.in_trainer,
            enable_lora=args.enable_lora,
            max_lora_rank=16 if args.max_lora_rank is None else args.max_lora_rank,
            max_loras=1 if args.max_loras is None else args.max_loras,
            limit_mm_per_prompt=parse_mm_limits(args.limit_mm_per_prompt)
            if args.limit_mm_per_prompt
            else None,
            **plan_device.settings_fields(args),
            cache_type_v=args.cache_type_v,
            flash_attn=_on_off(args.flash_attn),
            n_ubatch=count(args.ubatch_size),
            llamacpp_server=args.llamacpp_server or "llama-server",
            enable_chunked_prefill=_on_off(args.enable_chunked_prefill),
            flashinfer_sampler=_on_off(args.flashinfer_sampler),
            gpu_p2p=_on_off(args.gpu_p2p),
            allow_long_max_model_len=args.allow_long_max_model_len,
            rope_scaling_factor=args.rope_scaling_factor,
            disable_sliding_window=args.disable_sliding_window,
            continuous_batching=args.continuous_batching,
            kv_offload=plan_options.kv_offload(args),
            host_memory_bytes=plan_options.host_memory(args),
            **_llamacpp_placement(args),
        )
    )


def _llamacpp_placement(args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp's placement flags, spelled as llama.cpp spells them (and Ollama's -ngl / overhead)."""
    from vramlab.capacity.planning import parse_bytes, parse_count

    out: dict[str, Any] = (
        {"ollama_gpu_overhead_bytes": parse_bytes(args.ollama_gpu_overhead)}
        if args.ollama_gpu_overhead
        else {}
    )
    if args.engine != "llama.cpp":  # check_engine_flags refused every other placement flag
        if args.engine == "ollama" and args.n_gpu_layers is not None:
            out["n_gpu_layers"] = _ngl(args.n_gpu_layers)
        return out
    return {
        "n_gpu_layers": _ngl(args.n_gpu_layers) if args.n_gpu_layers is not None else None,
        "override_tensor": tuple(args.override_tensor),
        "tensor_split": _split(args.tensor_split),
        "n_cpu_moe": 1 << 12 if args.cpu_moe else args.n_cpu_moe,
        "split_mode": args.split_mode,
        "main_gpu": args.main_gpu,
        "no_kv_offload": args.no_kv_offload,
        "mmap": not args.no_mmap,
        "fit": _on_off(args.fit),
        "fit_target_mib": _mib_list(args.fit_target),
        "fit_ctx": parse_count(args.fit_ctx) if args.fit_ctx else None,
    }


MAX_LAYERS_FLAG = 100_000  # far above any model's layer count; a longer number is a typo, not a request


def _ngl(text: str) -> int | None:
    """llama.cpp's -ngl: `auto` and -1 are its default (None: --fit may choose), `all` offloads every layer and
    counts as set by the user (-1 here), like any count: ASCII digits only (`int()` would also take '²' or a
    5,000-digit number, and fail on them)."""
    from vramlab.errors import ConfigError

    value = str(text).strip().lower()
    if value in ("auto", "-1"):
        return None
    if value == "all":
        return -1
    if re.fullmatch(r"[0-9]{1,6}", value) and int(value) <= MAX_LAYERS_FLAG:
        return int(value)
    shown = text if len(str(text)) <= 20 else f"{str(text)[:20]}... ({len(str(text))} characters)"
    raise ConfigError(
        f"--n-gpu-layers: expected a count up to {MAX_LAYERS_FLAG:,}, auto, all or -1, got {shown!r}"
    )


def _mib_list(text: str | None) -> tuple[int, ...]:
    """--fit-target: MiB per device, ASCII digits, at most one per card llama.cpp can drive."""
    from vramlab.errors import ConfigError

    if not text:
        return ()
    parts = str(text).replace("/", ",").split(",")
    if len(parts) > 16 or not all(re.fullmatch(r"[0-9]{1,7}", x.strip()) for x in parts):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ConfigError(f"--fit-target: expected MiB per device like 1024 or 512,2048, got {shown!r}")
    return tuple(int(x) for x in parts)


def _auto(value: str | None) -> bool:
    """vLLM's `--max-model-len auto` / -1 (human_readable_int_or_auto)."""
    return value is not None and value.strip().lower() in ("auto", "-1")


def _split(text: str | None) -> tuple[float, ...] | None:
    """-ts 3,1 (or 3/1): finite proportions >= 0 that add up to a finite number above 0, as llama.cpp needs them
    (1e308,1e308 overflows the sum and nan compares false everywhere: both once put every layer on the last card)."""
    from vramlab.errors import ConfigError

    if not text:
        return None
    parts = str(text).replace("/", ",").split(",")
    if len(parts) > 16:  # GGML_CUDA_MAX_DEVICES
        raise ConfigError(f"--tensor-split: at most 16 proportions (one per card), got {len(parts)}")
    try:
        values = tuple(float(x) for x in parts)
    except ValueError:
        raise ConfigError(f"--tensor-split: expected proportions like 3,1, got {text!r}") from None
    bad = next((x for x in values if not math.isfinite(x) or x < 0), None)
    if bad is not None:
        raise ConfigError(
            f"--tensor-split: every proportion must be a finite number >= 0, got {bad} in {text!r}"
        )
    if not math.isfinite(sum(values)) or sum(values) <= 0:
        raise ConfigError(
            f"--tensor-split: the proportions must add up to a finite number above 0, got {text!r} "
            "(they are ratios: 3,1 is the same as 0.75,0.25)"
        )
    return values


def _on_off(value: str | None) -> bool | None:
    return None if value in (None, "auto") else value == "on"


def card(args: argparse.Namespace) -> GPU:
    """The card the plan is for (cli/plan_device.py: a MIG slice, a unified machine, a capped share), or the host
    for a CPU engine."""
    if on_host(args):
        return host_card(args)
    return plan_device.target(args)


def devices(args: argparse.Namespace, settings: EngineSettings) -> EngineSettings:
    """`--gpu rtx-4090,rtx-5090`: llama.cpp's devices in order (CUDA0, CUDA1, ...)."""
    from vramlab.capacity import get_gpu
    from vramlab.errors import ConfigError

    names = [n.strip() for n in (args.gpu or "").split(",") if n.strip()]
    if len(names) <= 1 or on_host(args):
        return settings
    if settings.engine not in ("llama.cpp", "ollama"):
        raise ConfigError(
            "--gpu with several cards: only --engine llama.cpp and ollama plan unequal cards (use -tp/-pp)"
        )
    if args.gpu_memory_gib:
        raise ConfigError("--gpu-memory-gib applies to one card: name each card with --gpu A,B")
    cards = tuple((g.name, g.memory_bytes) for g in (get_gpu(n) for n in names))
    return settings.with_(devices=cards)


def on_host(args: argparse.Namespace) -> bool:
    """`--gpu cpu`, or llama.cpp with no GPU layers and no card named: a CPU engine, planned on the host."""
    from vramlab.capacity.gpus import HOST_NAMES

    names = [n.strip().lower() for n in (args.gpu or "").split(",") if n.strip()]
    no_gpu_layers = args.engine == "llama.cpp" and str(args.n_gpu_layers).strip() == "0"
    return any(n in HOST_NAMES for n in names) or (not names and no_gpu_layers and not args.gpu_memory_gib)


def host_card(args: argparse.Namespace) -> GPU:
    """The host as the device: --host-memory-gib, else this machine's MemTotal."""
    from vramlab.capacity.gpus import host_device
    from vramlab.errors import ConfigError
    from vramlab.sources.host import host_memory_gib

    if len([n for n in (args.gpu or "").split(",") if n.strip()]) > 1:
        raise ConfigError("--gpu cpu: the host is planned alone; name no other card")
    if args.gpu_memory_gib is not None:
        raise ConfigError("--gpu cpu: give the host's memory with --host-memory-gib, not --gpu-memory-gib")
    if args.gpu_memory_limit_gib is not None or args.mps_memory_limit_gib is not None:
        raise ConfigError(
            "--gpu cpu: --gpu-memory-limit-gib and --mps-memory-limit-gib share a card, not the host"
        )
    memory = args.host_memory_gib if args.host_memory_gib is not None else host_memory_gib()
    if memory is None:
        raise ConfigError("--gpu cpu: this machine's memory is not readable; give --host-memory-gib")
    return host_device(memory)
