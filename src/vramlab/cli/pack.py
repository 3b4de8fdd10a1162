"""Place several models on shared GPUs: per-instance settings, start order, memory map, residency.

  vramlab pack fleet.yaml models.yaml
  vramlab pack fleet.yaml models.yaml --json
  vramlab pack fleet.yaml models.yaml --plot memmap.png
  vramlab pack fleet.yaml models.yaml --simulate trace.jsonl --policy keep-alive --keep-alive-s 300

The JSON object is documented in docs/pack.md. Exit status: 0 when everything fits, 1 when it
does not (the output says why and what would make it fit), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fleet", help="fleet YAML: GPU kinds and counts per node (see docs/pack.md)")
    parser.add_argument(
        "models", help="models YAML: model, engine, settings, concurrency x context, traffic..."
    )
    parser.add_argument(
        "--method",
        choices=("auto", "ffd", "exact"),
        default="auto",
        help="placement search: first-fit decreasing + improvement, exact branch and bound, "
        "or auto (exact for small cases; default)",
    )
    parser.add_argument(
        "--simulate",
        metavar="TRACE",
        help="replay a JSON-lines request trace through the "
        'residency policy ({"t_s", "model", "prompt_tokens", "output_tokens"} per line)',
    )
    parser.add_argument(
        "--policy",
        choices=("lru", "priority", "keep-alive", "sleep-1", "sleep-2"),
        help="eviction policy (overrides the models file's policy.eviction)",
    )
    parser.add_argument(
        "--keep-alive-s",
        type=float,
        help="idle seconds before unloading under keep-alive "
        "(default 300, like Ollama; 0 unloads at once, -1 never)",
    )
    parser.add_argument("--json", action="store_true", help="print the documented JSON object")
    parser.add_argument("--plot", metavar="FILE.png", help="write the memory map per card as a PNG")


def run(args: argparse.Namespace) -> int:
    from vramlab.placement.demand import CapacityDemand
    from vramlab.placement.inputs import load_inputs
    from vramlab.placement.residency import load_trace
    from vramlab.placement.result import plan_fleet, render_table, to_json, with_policy

    if args.plot:
        from vramlab.cli.outputs import check_writable

        check_writable(args.plot, "memory map")
    inputs = load_inputs(args.fleet, args.models)
    trace = load_trace(args.simulate) if args.simulate else None
    policy = with_policy(inputs.policy, args.policy, args.keep_alive_s)
    plan = plan_fleet(inputs, CapacityDemand(), method=args.method, policy=policy, trace=trace)
    if args.json:
        print(json.dumps(to_json(plan), indent=2, sort_keys=False))
    else:
        print(render_table(plan))
    if args.plot:  # after the placement is printed, so a failed write loses nothing
        from vramlab.cli.outputs import output_file
        from vramlab.placement.memmap import plot_memory_map

        with output_file(args.plot, "memory map", "the placement is printed above") as tmp:
            plot_memory_map(plan, tmp)
        if not args.json:
            print(f"\nmemory map written to {args.plot}")
    return 0 if plan.feasible else 1
