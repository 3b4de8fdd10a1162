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
  vramlab plan --model llama-3.1-8b-instruct --gpu l4 --prefix-shared-tokens 2000 --request-tokens 3000

Settings left out take the engine's own defaults for that version and GPU. Byte figures print
in GiB (2^30 bytes); --json prints integers in bytes (docs/plan-json.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlab.capacity import Constants


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vramlab.cli.plan_args import add_arguments as add

    add(p, __doc__.split("\n", 2)[2] if __doc__ else None)


def run(args: argparse.Namespace) -> int:
    from vramlab.capacity.planning import make_plan, parse_sweep, sweep
    from vramlab.cli import plan_options
    from vramlab.cli.plan_settings import card, check_quantizations, check_sweep_keys, devices, settings_of
    from vramlab.sources import resolve_model

    settings = settings_of(args)
    spec, draft = plan_options.speculative(args)
    gpu = card(args)
    settings = devices(args, settings)
    axes = plan_options.check_comparison(args, [parse_sweep(s) for s in args.sweep])
    check_sweep_keys(settings.engine, axes)
    if args.plot and not axes:
        from vramlab.errors import ConfigError

        raise ConfigError("--plot draws a --sweep grid: add --sweep KEY=V1,V2")
    if args.plot:
        from vramlab.cli.outputs import check_writable

        check_writable(args.plot, "plot")
    constants = _constants(args) if args.calibration else None
    model = resolve_model(args.model, offline=args.offline, revision=args.revision)
    check_quantizations(settings, axes, model)
    settings = plan_options.with_draft(settings, spec, draft, args.offline)
    if args.vs_engine_version:
        return plan_options.run_comparison(args, model, gpu, settings, constants)
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
    plan = make_plan(
        model,
        gpu,
        settings,
        constants,
        margin=args.margin,
        concurrency=args.concurrency,
        prefix_shared_tokens=args.prefix_shared_tokens,
        request_tokens=args.request_tokens,
    )
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print(plan_text.render_plan(plan, model, gpu))
    return plan.verdict.exit_code  # 0 fits, 3 at the estimate only, 4 part on the CPU, 1 does not fit


def _constants(args: argparse.Namespace) -> Constants:
    from vramlab.capacity import Constants
    from vramlab.capacity.calibration import apply_profile
    from vramlab.sources.profile import load_profile

    profile = load_profile(args.calibration)
    return apply_profile(Constants.defaults(), profile, args.engine, args.engine_version)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
