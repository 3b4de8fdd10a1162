"""Read what an engine decided at start-up from its log, beside vramlab's prediction.

Reads any excerpt of a vLLM (every era), SGLang, TGI, llama.cpp (llama-server or
llama-cpp-python) or Ollama log: weights, non-torch memory, activation peak, CUDA graphs, KV
cache bytes, tokens and blocks, maximum concurrency, and failed start-ups, per rank and per
start-up. The prediction for the same settings is added from what the log says: the model it
names (or, for llama.cpp, the shape it prints), the card its total memory, nvidia-smi or device
lines name, a llama.cpp device split; --model and --gpu fill only what it does not say, and one
line names what is missing. A file holding several logs (compose, journald or k9s writers, two
vLLM servers, several engines) gives a report for each. Several files or a folder give one table
per engine era.

examples:
  vramlab check-log vllm-startup.log
  vramlab check-log sglang.log --model qwen3-8b --gpu h100-80gb
  vramlab check-log vllm-startup.log --json
  vramlab check-log logs/                      # every log in the folder, one table per engine era
  kubectl logs my-vllm-pod | vramlab check-log -
"""

from __future__ import annotations

import argparse
import json
from typing import Any

MAX_BYTES_LIMIT = 1 << 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="engine log(s) or folder(s) of logs (vLLM, SGLang, TGI, llama.cpp, Ollama); - reads stdin",
    )
    parser.add_argument(
        "--model",
        help="model name, Hub id or local path (default: the one the log names or llama.cpp's printed shape)",
    )
    parser.add_argument(
        "--gpu",
        help="GPU catalog name (default: the log's total memory, or the card its nvidia-smi or device lines name)",
    )
    parser.add_argument("--engine", help="engine that wrote the log (default: detected)")
    parser.add_argument("--engine-version", help="engine version when the log does not print it")
    parser.add_argument(
        "--quantization",
        help="the model file's quantization when the log does not print it "
        "(e.g. Q4_K_M for an Ollama estimate line)",
    )
    parser.add_argument(
        "--calibration", metavar="PROFILE", help="calibration profile (.toml) to predict with"
    )
    parser.add_argument(
        "--online", action="store_true", help="allow reading a model's config from the Hugging Face Hub"
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        metavar="N",
        help="stop reading each log after N bytes (default 64 MiB; bounds /dev/zero, pipes, huge logs)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (docs/logs-and-calibration.md)"
    )


def run(args: argparse.Namespace) -> int:
    from vramlab.logs.check import FolderReport, check_file, check_logs
    from vramlab.report.check_log_text import render, render_file, render_folder

    kwargs: dict[str, Any] = dict(
        model=args.model,
        gpu=args.gpu,
        engine=args.engine,
        engine_version=args.engine_version,
        calibration=args.calibration,
        offline=not args.online,
        max_bytes=args.max_bytes,
        quantization=args.quantization,
    )
    if args.max_bytes is not None and not 1 <= args.max_bytes <= MAX_BYTES_LIMIT:
        from vramlab.errors import ConfigError

        raise ConfigError(
            f"--max-bytes must be between 1 and {MAX_BYTES_LIMIT:,} (1 GiB: reading takes time in "
            f"proportion), got {args.max_bytes:,}"
        )
    from vramlab.infile import is_folder

    if len(args.files) == 1 and not is_folder(args.files[0]):
        reports, skipped = check_file(args.files[0], **kwargs)
        if len(reports) == 1 and not skipped:
            print(json.dumps(reports[0].to_json(), indent=1) if args.json else render(reports[0]))
            return 0
        folder = FolderReport(reports, skipped)  # several logs in one file: a report each
        print(json.dumps(folder.to_json(), indent=1) if args.json else render_file(reports, skipped))
        return 0
    folder = check_logs(args.files, **kwargs)
    print(json.dumps(folder.to_json(), indent=1) if args.json else render_folder(folder))
    return 0
