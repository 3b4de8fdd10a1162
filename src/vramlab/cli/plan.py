"""Predict the VRAM breakdown and capacity of a model on a GPU under a serving engine.

examples:
  vramlab plan --model llama-3.1-8b-instruct --gpu h100-80gb --max-model-len 8192
  vramlab plan --model ./my-model/ --gpu l4 --engine vllm --gpu-memory-utilization 0.9 --json
  vramlab plan --model qwen2.5-72b-instruct-awq --gpu a100-80gb -tp 2 --engine sglang
  vramlab plan --model ./model.gguf --gpu rtx-4090 --engine llama.cpp --ctx-size 32768 --parallel 4
  vramlab plan --model deepseek-v3 --gpu h200 -tp 8 --kv-cache-dtype fp8
  vramlab plan --model qwen3-30b-a3b --gpu rtx-4090 --engine llama.cpp --quantization Q4_K_M -c 64k --n-cpu-moe 4
  vramlab plan --model qwen3-8b --gpu rtx-3070 --engine ollama --quantization Q4_K_M --max-model-len 32k
  vramlab plan --model qwen3-8b --gpu l4 --sweep max-model-len=2k,8k,32k --sweep max-num-seqs=16,64,256 --plot grid.png

Settings left out take the engine's own defaults for that version and GPU. Byte figures print
in GiB (2^30 bytes); --json prints integers in bytes (docs/plan-json.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from vramlab.cli import plan_device

if TYPE_CHECKING:
    from vramlab.capacity import Constants, EngineSettings

ENGINES = ("vllm", "sglang", "tgi", "llama.cpp", "transformers", "ollama")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = __doc__.split("\n", 2)[2] if __doc__ else None
    m = p.add_argument_group("model and card")
    m.add_argument(
        "--model", required=True, help="catalog name, Hugging Face id, directory, config.json or .gguf"
    )
    m.add_argument("--revision", help="Hub revision for a Hub id")
    m.add_argument("--offline", action="store_true", help="never touch the network (cache and catalog only)")
    plan_device.add_card_arguments(m)
    e = p.add_argument_group("engine settings (the engines' own names and meanings)")
    e.add_argument("--engine", choices=ENGINES, default="vllm")
    e.add_argument("--engine-version", help="engine release, e.g. 0.8.5 (default: the newest modelled)")
    e.add_argument(
        "--vllm-engine", choices=("v0", "v1"), help="vLLM engine generation (default: the release's own)"
    )
    e.add_argument("--gpu-memory-utilization", type=float)
    e.add_argument(
        "--max-model-len",
        help="context length per request (accepts 8k, 128k); vLLM 0.12+: auto or -1 = the longest that fits",
    )
    e.add_argument("--max-num-seqs", help="vLLM max_num_seqs / SGLang max_running_requests / batch size")
    e.add_argument("--max-num-batched-tokens")
    e.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    e.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    e.add_argument("--dtype", default="auto")
    e.add_argument("--kv-cache-dtype", default="auto")
    e.add_argument("--quantization", help="load-time quantization (fp8, awq, gptq, bitsandbytes, ...)")
    e.add_argument("--enforce-eager", action="store_true")
    e.add_argument("--block-size", type=int)
    e.add_argument(
        "--kv-cache-memory",
        "--kv-cache-memory-bytes",
        help="vLLM --kv-cache-memory-bytes: the KV pool, bypassing gpu_memory_utilization (bytes, or e.g. 20GiB)",
    )
    e.add_argument("--mem-fraction-static", type=float, help="SGLang")
    e.add_argument("--chunked-prefill-size", type=int, help="SGLang")
    e.add_argument("--max-batch-prefill-tokens", type=int, help="TGI")
    _local_engine_arguments(e)
    e.add_argument(
        "--enable-chunked-prefill",
        choices=("on", "off", "auto"),
        help="vLLM V0 (default auto: on above a 32k context)",
    )
    e.add_argument(
        "--flashinfer-sampler",
        choices=("on", "off", "auto"),
        help="vLLM V1: the profiled sampler runs FlashInfer (on) or sorts the vocabulary (off); auto = the "
        "release's default (before 0.11.1 it depends on whether FlashInfer is installed; the log says "
        "'Using FlashInfer for top-p & top-k sampling')",
    )
    e.add_argument(
        "--gpu-p2p",
        choices=("on", "off", "auto"),
        help="vLLM: off when the GPUs cannot reach each other over P2P/NVLink (the log: 'Custom allreduce is "
        "disabled because your platform lacks GPU P2P capability' or '... spans across nodes'); "
        "on / auto = from the card (SXM cards sit on an NVSwitch, PCIe cards do not)",
    )
    e.add_argument(
        "--allow-long-max-model-len",
        action="store_true",
        help="vLLM with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: plan a max_model_len above the trained context",
    )
    e.add_argument(
        "--rope-scaling-factor",
        type=float,
        help="a rope-scaling override (vLLM --hf-overrides / --rope-scaling) that extends the context",
    )
    e.add_argument(
        "--disable-sliding-window",
        action="store_true",
        help="vLLM --disable-sliding-window: max_model_len capped at the window, every layer full attention",
    )
    e.add_argument(
        "--continuous-batching", action="store_true", help="transformers serve --continuous-batching"
    )
    e.add_argument(
        "--llm-class", action="store_true", help="vLLM: defaults of the offline LLM class, not `vllm serve`"
    )
    e.add_argument(
        "--in-trainer",
        action="store_true",
        help="vLLM's LLM class inside a training process (Unsloth, TRL colocate): implies --llm-class; "
        "the trainer's own allocations are not modelled, so the bands widen",
    )
    e.add_argument(
        "--enable-lora",
        action="store_true",
        help="vLLM --enable-lora: the LoRA slots it allocates at load count as weights",
    )
    e.add_argument("--max-lora-rank", type=int, default=16, help="vLLM --max-lora-rank (default 16)")
    e.add_argument("--max-loras", type=int, default=1, help="vLLM --max-loras (default 1)")
    e.add_argument(
        "--limit-mm-per-prompt",
        metavar="SPEC",
        help="vLLM --limit-mm-per-prompt, as JSON or image=2,video=0: which images and videos V1 profiles "
        "through the vision encoder at start-up (default 999 each)",
    )
    _output_arguments(p)


def _output_arguments(p: argparse.ArgumentParser) -> None:
    o = p.add_argument_group("questions and output")
    o.add_argument(
        "--concurrency", type=int, help="also report the largest max_model_len for this many sequences"
    )
    o.add_argument("--margin", type=float, default=0.10, help="safety margin of the KV pool (default 0.10)")
    o.add_argument("--calibration", help="a calibration profile from `vramlab calibrate`")
    o.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="sweep a setting (repeat for a grid), e.g. max-model-len=2k,8k,32k",
    )
    o.add_argument("--plot", help="with --sweep: write a PNG of the grid")
    o.add_argument("--json", action="store_true", help="print one JSON object")


def _local_engine_arguments(e: argparse._ArgumentGroup) -> None:
    """llama.cpp's and Ollama's own flags (placement over cards and the host)."""
    e.add_argument("--ctx-size", "-c", help="llama.cpp n_ctx over all slots (accepts 32k)")
    e.add_argument("--parallel", "-np", type=int, help="llama.cpp slots")
    e.add_argument("--cache-type-v", help="llama.cpp V cache type (default: the K type, --kv-cache-dtype)")
    e.add_argument("--flash-attn", "-fa", choices=("on", "off", "auto"), help="llama.cpp flash attention")
    e.add_argument("--ubatch-size", "-ub", help="llama.cpp n_ubatch (default 512)")
    e.add_argument(
        "--llamacpp-server",
        choices=("llama-server", "llama-cpp-python"),
        default="llama-server",
        help="whose defaults: upstream llama-server or `python -m llama_cpp.server`",
    )
    e.add_argument(
        "--n-gpu-layers",
        "-ngl",
        help="llama.cpp layers on the GPUs (the last N; all or -1 = every "
        "layer and the output layer; default all)",
    )
    e.add_argument(
        "--override-tensor",
        "-ot",
        action="append",
        default=[],
        metavar="REGEX=BUFT",
        help="llama.cpp: tensors whose name matches REGEX go to BUFT (CPU, CUDA1, ...); repeatable",
    )
    e.add_argument(
        "--n-cpu-moe",
        type=int,
        default=0,
        help="llama.cpp: keep the MoE experts of the first N layers on the host",
    )
    e.add_argument("--cpu-moe", action="store_true", help="llama.cpp: keep every MoE expert on the host")
    e.add_argument(
        "--tensor-split", "-ts", help="llama.cpp proportions per card, e.g. 3,1 (default: by free memory)"
    )
    e.add_argument("--split-mode", "-sm", choices=("layer", "row", "none"), default="layer", help="llama.cpp")
    e.add_argument(
        "--main-gpu", "-mg", type=int, default=0, help="llama.cpp: the card for --split-mode none/row"
    )
    e.add_argument(
        "--fit",
        "-fit",
        choices=("on", "off"),
        help="llama-server --fit: cut the context / move weights to the host to keep --fit-target free "
        "(default on from b7414; settings you give are never changed)",
    )
    e.add_argument(
        "--fit-target", "-fitt", help="llama.cpp --fit margin per device in MiB, e.g. 1024 or 512,2048"
    )
    e.add_argument(
        "--fit-ctx", "-fitc", help="llama.cpp --fit: the shortest context it may cut to (default 4096)"
    )
    e.add_argument("--no-kv-offload", "-nkvo", action="store_true", help="llama.cpp: KV cache in host memory")
    e.add_argument(
        "--no-mmap", action="store_true", help="llama.cpp: host tensors in a CPU buffer, not mapped"
    )
    e.add_argument(
        "--ollama-gpu-overhead",
        help="Ollama OLLAMA_GPU_OVERHEAD (bytes, or e.g. 1GiB) held back per GPU; "
        "with --engine ollama, --max-model-len is num_ctx, --parallel OLLAMA_NUM_PARALLEL, -ngl num_gpu, "
        "--flash-attn on OLLAMA_FLASH_ATTENTION=1 and --kv-cache-dtype OLLAMA_KV_CACHE_TYPE",
    )


def _settings(args: argparse.Namespace) -> EngineSettings:
    from vramlab.capacity import EngineSettings
    from vramlab.capacity.planning import parse_bytes, parse_count, parse_mm_limits
    from vramlab.capacity.validation import check_settings
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
            mem_fraction_static=args.mem_fraction_static,
            chunked_prefill_size=args.chunked_prefill_size,
            max_batch_prefill_tokens=args.max_batch_prefill_tokens,
            ctx_size=count(args.ctx_size),
            parallel=args.parallel,
            api_server=not (args.llm_class or args.in_trainer),
            in_trainer=args.in_trainer,
            enable_lora=args.enable_lora,
            max_lora_rank=args.max_lora_rank,
            max_loras=args.max_loras,
            limit_mm_per_prompt=parse_mm_limits(args.limit_mm_per_prompt)
            if args.limit_mm_per_prompt
            else None,
            **plan_device.settings_fields(args),
            cache_type_v=args.cache_type_v,
            flash_attn=_on_off(args.flash_attn),
            n_ubatch=count(args.ubatch_size),
            llamacpp_server=args.llamacpp_server,
            enable_chunked_prefill=_on_off(args.enable_chunked_prefill),
            flashinfer_sampler=_on_off(args.flashinfer_sampler),
            gpu_p2p=_on_off(args.gpu_p2p),
            allow_long_max_model_len=args.allow_long_max_model_len,
            rope_scaling_factor=args.rope_scaling_factor,
            disable_sliding_window=args.disable_sliding_window,
            continuous_batching=args.continuous_batching,
            **_llamacpp_placement(args),
        )
    )


def _llamacpp_placement(args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp's placement flags, spelled as llama.cpp spells them (and Ollama's -ngl / overhead)."""
    from vramlab.capacity.planning import parse_bytes, parse_count
    from vramlab.errors import ConfigError

    if args.ollama_gpu_overhead and args.engine != "ollama":
        raise ConfigError("--ollama-gpu-overhead: an Ollama setting; add --engine ollama")
    out: dict[str, Any] = (
        {"ollama_gpu_overhead_bytes": parse_bytes(args.ollama_gpu_overhead)}
        if args.ollama_gpu_overhead
        else {}
    )
    if args.engine != "llama.cpp":
        given = [
            f
            for f, v in (
                ("--n-gpu-layers", args.n_gpu_layers and args.engine != "ollama"),
                ("--override-tensor", args.override_tensor),
                ("--n-cpu-moe", args.n_cpu_moe),
                ("--cpu-moe", args.cpu_moe),
                ("--tensor-split", args.tensor_split),
                ("--no-kv-offload", args.no_kv_offload),
                ("--main-gpu", args.main_gpu),
                ("--split-mode", args.split_mode != "layer"),
                ("--no-mmap", args.no_mmap),
                ("--fit", args.fit),
                ("--fit-target", args.fit_target),
                ("--fit-ctx", args.fit_ctx),
            )
            if v
        ]
        if given:
            raise ConfigError(f"{', '.join(given)}: llama.cpp settings; add --engine llama.cpp")
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


def _ngl(text: str) -> int | None:
    """llama.cpp's -ngl: `auto` and -1 are its default (None: --fit may choose), `all` offloads every
    layer and counts as set by the user (-1 here), like any count."""
    from vramlab.errors import ConfigError

    value = str(text).strip().lower()
    if value in ("auto", "-1"):
        return None
    if value == "all":
        return -1
    if value.isdigit():
        return int(value)
    raise ConfigError(f"--n-gpu-layers: expected a count, auto, all or -1, got {text!r}")


def _mib_list(text: str | None) -> tuple[int, ...]:
    from vramlab.errors import ConfigError

    if not text:
        return ()
    try:
        return tuple(int(x) for x in text.replace("/", ",").split(","))
    except ValueError:
        raise ConfigError(
            f"--fit-target: expected MiB per device like 1024 or 512,2048, got {text!r}"
        ) from None


def _split(text: str | None) -> tuple[float, ...] | None:
    from vramlab.errors import ConfigError

    if not text:
        return None
    try:
        return tuple(float(x) for x in text.replace("/", ",").split(","))
    except ValueError:
        raise ConfigError(f"--tensor-split: expected proportions like 3,1, got {text!r}") from None


def _auto(value: str | None) -> bool:
    """vLLM's `--max-model-len auto` / -1 (human_readable_int_or_auto)."""
    return value is not None and value.strip().lower() in ("auto", "-1")


def _on_off(value: str | None) -> bool | None:
    return None if value in (None, "auto") else value == "on"


def _devices(args: argparse.Namespace, settings: EngineSettings) -> EngineSettings:
    """`--gpu rtx-4090,rtx-5090`: llama.cpp's devices in order (CUDA0, CUDA1, ...)."""
    from vramlab.capacity import get_gpu
    from vramlab.errors import ConfigError

    names = [n.strip() for n in (args.gpu or "").split(",") if n.strip()]
    if len(names) <= 1:
        return settings
    if settings.engine not in ("llama.cpp", "ollama"):
        raise ConfigError(
            "--gpu with several cards: only --engine llama.cpp and ollama plan unequal cards (use -tp/-pp)"
        )
    if args.gpu_memory_gib:
        raise ConfigError("--gpu-memory-gib applies to one card: name each card with --gpu A,B")
    cards = tuple((g.name, g.memory_bytes) for g in (get_gpu(n) for n in names))
    return settings.with_(devices=cards)


def run(args: argparse.Namespace) -> int:
    from vramlab.capacity.planning import make_plan, parse_sweep, sweep
    from vramlab.sources import resolve_model

    settings = _settings(args)
    gpu = plan_device.target(args)
    settings = _devices(args, settings)
    axes = [parse_sweep(s) for s in args.sweep]
    if args.plot and not axes:
        from vramlab.errors import ConfigError

        raise ConfigError("--plot draws a --sweep grid: add --sweep KEY=V1,V2")
    if args.plot:
        from vramlab.cli.outputs import check_writable

        check_writable(args.plot, "plot")
    constants = _constants(args) if args.calibration else None
    model = resolve_model(args.model, offline=args.offline, revision=args.revision)
    from vramlab.report import plan_text

    if axes:
        result = sweep(model, gpu, settings, axes, constants)
        if args.json:
            print(
                json.dumps(
                    {
                        "model": model.name,
                        "gpu": gpu.name,
                        "engine": settings.engine,
                        "axes": [[n, v] for n, v in result.axes],
                        "rows": result.rows,
                    },
                    indent=1,
                )
            )
        else:
            print(plan_text.render_sweep(result, model.name, gpu))
        if args.plot:  # after the grid is printed, so a failed write loses nothing
            from pathlib import Path

            from vramlab.cli.outputs import write_output

            fmt = Path(args.plot).suffix.lstrip(".").lower() or "png"
            image = plan_text.plot_sweep(result, fmt, title=f"{model.name} on {gpu.name} ({settings.engine})")
            write_output(args.plot, image, "plot", "the grid is printed above")
            if not args.json:
                print(f"plot written to {args.plot}")
        return 0
    plan = make_plan(model, gpu, settings, constants, margin=args.margin, concurrency=args.concurrency)
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print(plan_text.render_plan(plan, model, gpu))
    return 0 if plan.estimate.fits else 1


def _constants(args: argparse.Namespace) -> Constants:
    from vramlab.capacity import Constants
    from vramlab.capacity.calibration import apply_profile
    from vramlab.sources.profile import load_profile

    profile = load_profile(args.calibration)
    return apply_profile(Constants.defaults(), profile, args.engine, args.engine_version)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
