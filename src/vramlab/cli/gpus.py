"""List the GPU catalog: usable memory as the framework reports it, bandwidth and bf16 FLOP/s."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")


def run(args: argparse.Namespace) -> int:
    from vramlab.capacity.gpus import GPUS
    from vramlab.cli.models import render_table

    if args.json:
        out = [
            {
                "name": g.name,
                "vendor": g.vendor,
                "arch": g.arch,
                "memory_gib": g.memory_gib,
                "memory_bytes": g.memory_bytes,
                "nominal_gb": g.nominal_gb,
                "bandwidth_gbps": g.bandwidth_gbps,
                "bf16_tflops": g.bf16_tflops,
                "fp8": g.fp8,
                "aliases": list(g.aliases),
                "memory_source": g.memory_source,
            }
            for g in GPUS
        ]
        print(json.dumps(out, indent=2))
        return 0
    rows = [
        (
            "NAME",
            "VENDOR",
            "ARCH",
            "MEMORY GiB",
            "NOMINAL GB",
            "BANDWIDTH GB/s",
            "BF16 TFLOP/s",
            "FP8",
            "ALIASES",
        )
    ]
    rows += [
        (
            g.name,
            g.vendor,
            g.arch,
            f"{g.memory_gib:.2f}",
            f"{g.nominal_gb:g}",
            f"{g.bandwidth_gbps:g}",
            f"{g.bf16_tflops:g}",
            "yes" if g.fp8 else "-",
            ", ".join(g.aliases),
        )
        for g in GPUS
    ]
    print(render_table(rows, right_aligned={3, 4, 5, 6}))
    print(
        "\nMEMORY is what torch/vLLM report as total (GiB = 2^30 bytes), less than the nominal figure. "
        "For another card use `vramlab plan --gpu-memory-gib N`."
    )
    return 0
