"""Compare an engine's start-up log with vramlab's prediction for the same settings.

Reads what the engine decided (weights, activation peak, non-torch memory, CUDA graphs, KV
cache, concurrency), predicts the same with `vramlab plan`'s model, and prints both side by
side with the difference and the component that explains most of the KV difference. The
model, GPU and settings come from the log when it prints them; flags fill the gaps.

examples:
  vramlab check-log vllm-startup.log
  vramlab check-log sglang.log --model qwen3-8b --gpu h100-80gb
  vramlab check-log vllm-startup.log --json
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="engine log (vLLM, SGLang, TGI, llama.cpp, Ollama)")
    parser.add_argument("--model", help="model name, Hub id or local path (default: the one the log names)")
    parser.add_argument("--gpu", help="GPU catalog name (default: from the log's total memory)")
    parser.add_argument("--engine", help="engine that wrote the log (default: detected)")
    parser.add_argument("--engine-version", help="engine version when the log does not print it")
    parser.add_argument("--calibration", metavar="PROFILE", help="calibration profile (.toml) to predict with")
    parser.add_argument("--online", action="store_true", help="allow reading a model's config from the Hugging Face Hub")
    parser.add_argument("--json", action="store_true", help="print one JSON object (docs/logs-and-calibration.md)")


def run(args: argparse.Namespace) -> int:
    from vramlab.logs.check import check_log
    from vramlab.report.check_log_text import render

    report = check_log(args.file, model=args.model, gpu=args.gpu, engine=args.engine,
                       engine_version=args.engine_version, calibration=args.calibration,
                       offline=not args.online)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(render(report))
    return 0
