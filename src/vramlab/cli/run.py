"""Run a controlled experiment plan: rounds of baseline, treatment steps and recovery.

Everything is stored as it happens (SQLite ./vramlab.db by default, or --db / $VRAMLAB_DB).
Exit codes: 0 completed, 3 stopped by a stop condition, 130 interrupted (Ctrl-C / SIGTERM;
rollbacks still ran), 1 the run failed, 2 bad input (plan, flags, store).
See docs/experiments.md for the plan file reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramlab.experiment.runner import RunResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("exit codes: 0 completed, 3 stopped by a stop condition, 130 interrupted (rollbacks ran), "
                     "1 the run failed, 2 bad input. Plan reference: docs/experiments.md")
    parser.add_argument("plan", metavar="PLAN.yaml", help="the experiment plan")
    parser.add_argument("--db", metavar="URL", help="store: a file path, sqlite:///PATH or postgresql://... "
                        "(default $VRAMLAB_DB, else ./vramlab.db)")
    parser.add_argument("--rounds", type=int, metavar="N", help="override the plan's rounds (fewer than 3 warns)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout (progress goes to stderr)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="load worker processes, one schedule shared out (default: one per core when the "
                             "plan needs more than one core, else 1: in-process)")
    parser.add_argument("--i-understand-this-is-production", dest="allow_production", action="store_true",
                        help="allow a plan whose target.environment is production")


def summary(r: RunResult, store_url: str) -> dict[str, Any]:
    """The --json document: run_id, status, exit_code, stop_reason, stop_condition, requests,
    errors, elapsed_s, notes, store (password hidden), rollbacks [{command, exit_code}]."""
    from vramlab.store import describe_url

    return {
        "run_id": r.run_id, "status": r.status, "exit_code": r.exit_code,
        "stop_reason": None if r.stop_reason is None else r.stop_reason.message,
        "stop_condition": None if r.stop_reason is None else r.stop_reason.condition,
        "requests": r.requests, "errors": r.errors, "elapsed_s": round(r.elapsed_s, 3),
        "notes": list(r.notes), "store": describe_url(store_url),
        "rollbacks": [{"command": b.command, "exit_code": b.exit_code} for b in r.rollbacks],
    }


def run(args: argparse.Namespace) -> int:
    from vramlab.errors import ConfigError
    from vramlab.experiment.progress import make_progress
    from vramlab.experiment.runner import RunOptions
    from vramlab.experiment.session import run_plan_file

    if args.workers is not None and not 1 <= args.workers <= 256:
        raise ConfigError(f"--workers must be between 1 and 256, got {args.workers}")
    stream = sys.stderr if args.json else sys.stdout
    progress = make_progress(stream)
    try:
        out = run_plan_file(args.plan, db=args.db, rounds=args.rounds, allow_production=args.allow_production,
                            subscribers=[progress], options=RunOptions(workers=args.workers))
    finally:
        progress.close()
    s = summary(out.result, out.store_url)
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"run {s['run_id']}: {s['status']}, {s['requests']} requests, {s['errors']} errors, "
              f"{s['elapsed_s']:.1f} s" + (f" ({s['stop_reason']})" if s["stop_reason"] else ""))
        print(f"stored in {s['store']}; render it with: vramlab report {s['run_id']} --format html -o report.html")
    return out.result.exit_code
