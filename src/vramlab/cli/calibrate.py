"""Fit the capacity model's constants to engine logs and measurement files.

Inputs are start-up logs (any engine `check-log` reads) and JSONL measurement files (one
observation per line, docs/logs-and-calibration.md; vramlab's data set format is read too).
Constants are fitted per engine; one that too few observations depend on is refused and
named. Leave-one-out errors per component are reported before and after the fit. The profile
is applied with `vramlab plan --calibration FILE`.

Given run ids instead, it learns from stored runs (`vramlab run` / `drill` keep the capacity plan
beside the measured memory composition): the constants those measurements inform, with the
evidence for each, and the error before and after on those runs and on any --holdout run.

examples:
  vramlab calibrate logs/*.log measurements.jsonl -o my-fleet.calibration.toml
  vramlab calibrate 7f3a91bc 0c2e5d11 --holdout 9e8d7c6b -o runs.calibration.toml
  vramlab calibrate observed_memory.jsonl --model-configs model_configs.json -o dev.calibration.toml
"""

from __future__ import annotations

import argparse
import json

from vramlab.cli.runs import store_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="LOG_OR_JSONL_OR_RUN",
        help="engine logs and/or .jsonl measurement files; or stored run ids",
    )
    parser.add_argument(
        "--db",
        type=store_arg,
        metavar="URL",
        help="with run ids: the store (default $VRAMLAB_DB, else ./vramlab.db)",
    )
    parser.add_argument(
        "--holdout",
        action="append",
        metavar="RUN_ID",
        help="with run ids: a run to report the error on without learning from it (repeatable)",
    )
    parser.add_argument(
        "-o", "--output", metavar="PROFILE", help="write the calibration profile here (.toml)"
    )
    parser.add_argument(
        "--model-configs", metavar="JSON", help="hf id -> config.json map for models not in the catalog"
    )
    parser.add_argument("--engine", help="fit only this engine's observations")
    parser.add_argument(
        "--min-points",
        type=int,
        help="observations (log lines, JSONL rows or stored runs) a constant needs to be fitted (default 3)",
    )
    parser.add_argument(
        "--versions",
        metavar="MIN..MAX",
        help="engine versions the profile applies to (default: the range of the observations)",
    )
    parser.add_argument(
        "--online", action="store_true", help="allow reading model configs from the Hugging Face Hub"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vramlab.capacity.constants import MIN_POINTS, check_min_points
    from vramlab.cli.calibrate_runs import looks_like_runs
    from vramlab.errors import ConfigError
    from vramlab.logs.calibrate import calibrate
    from vramlab.report.calibrate_text import render, to_json

    args.min_points = check_min_points(MIN_POINTS if args.min_points is None else args.min_points)
    if looks_like_runs(args.inputs):
        from vramlab.cli.calibrate_runs import run as run_calibration

        return run_calibration(args)
    if args.holdout:
        raise ConfigError("--holdout takes stored runs: give run ids, not logs")
    if args.output:
        from vramlab.cli.outputs import check_writable

        check_writable(args.output, "calibration profile")
    name = Path(args.output).name if args.output else "calibration"
    result = calibrate(
        args.inputs,
        args.model_configs,
        args.engine,
        args.min_points,
        args.versions,
        offline=not args.online,
        name=name,
    )
    written, failed = None, None
    if args.output and result.fitted_any:
        from vramlab.capacity.calibration import profile_to_toml
        from vramlab.cli.outputs import write_output
        from vramlab.errors import OutputError

        try:
            write_output(
                args.output,
                profile_to_toml(result.profile),
                "calibration profile",
                "no profile written; the fit is printed (run calibrate again to write it)",
            )
            written = args.output
        except OutputError as exc:
            failed = exc
    if args.json:
        print(json.dumps(to_json(result), indent=1))
    else:
        print(render(result, written))
    if failed is not None:
        raise failed  # after the fit is printed: the work is not lost
    if not result.fitted_any:
        import sys

        reasons = sorted({r.reason for f in result.fits for r in f.refused})
        print(
            "vramlab calibrate: error: no constant was fitted"
            + (f" ({reasons[0]}{'; ...' if len(reasons) > 1 else ''})" if reasons else "")
            + ("; no profile written" if args.output else ""),
            file=sys.stderr,
        )
        return 1
    return 0
