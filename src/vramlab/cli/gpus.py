"""List the planning targets: cards, unified-memory machines and MIG slices, with the usable memory the engines
read as the device's total, bandwidth and bf16 FLOP/s, and where each memory figure comes from."""

from __future__ import annotations

import argparse
import json

KIND_CHOICES = ("discrete", "unified", "mig")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.add_argument(
        "--kind",
        choices=KIND_CHOICES,
        help="only cards (discrete), unified-memory machines (unified) or MIG slices (mig)",
    )


def run(args: argparse.Namespace) -> int:
    from vramlab.capacity.gpus import DEVICES
    from vramlab.cli.models import render_table

    targets = [g for g in DEVICES if args.kind in (None, g.kind)]
    if args.json:
        out = [
            {
                "name": g.name,
                "kind": g.kind,
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
                "parent": g.parent or None,
                "system_memory_gib": g.system_memory_gib or None,
                "os_reserved_gib": g.os_reserved_gib or None,
                "engines": list(g.engines) or None,
            }
            for g in targets
        ]
        print(json.dumps(out, indent=2))
        return 0
    rows = [
        (
            "NAME",
            "KIND",
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
            g.kind,
            g.vendor,
            g.arch,
            f"{g.memory_gib:.2f}",
            f"{g.nominal_gb:g}",
            f"{g.bandwidth_gbps:g}",
            f"{g.bf16_tflops:g}",
            "yes" if g.fp8 else "-",
            ", ".join(g.aliases),
        )
        for g in targets
    ]
    print(render_table(rows, right_aligned={4, 5, 6, 7}))
    print(
        "\nMEMORY is what the engines read as the device's total (GiB = 2^30 bytes), less than the nominal figure "
        "(`--json` says where each figure comes from). A MIG slice is CARD:PROFILE; a unified machine shares its "
        "memory with the OS. For another card use `vramlab plan --gpu-memory-gib N`."
    )
    return 0
