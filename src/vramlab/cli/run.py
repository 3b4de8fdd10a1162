"""Run a controlled experiment plan: rounds of baseline, treatment steps and recovery.

Everything is stored as it happens (SQLite ./vramlab.db by default, or --db / $VRAMLAB_DB).
Exit codes (the same policy as `vramlab drill`, docs/experiments.md): 0 completed, 3 stopped by a
stop condition, 130 interrupted (Ctrl-C / SIGTERM; rollbacks still ran), 1 the run failed, 2 bad
input (plan, flags, store), 70 a bug in vramlab (the run is stored as failed all the same).
See docs/experiments.md for the plan file reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from vramlab.cli.runs import store_arg

if TYPE_CHECKING:
    from vramlab.run.runner import RunResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit codes: 0 completed, 3 stopped by a stop condition, 130 interrupted (rollbacks ran), "
        "1 the run failed, 2 bad input. Plan reference: docs/experiments.md"
    )
    parser.add_argument("plan", metavar="PLAN.yaml", help="the experiment plan")
    parser.add_argument(
        "--db",
        type=store_arg,
        metavar="URL",
        help="store: a file path, sqlite:///PATH or postgresql://... "
        "(default $VRAMLAB_DB, else ./vramlab.db)",
    )
    parser.add_argument(
        "--rounds", type=int, metavar="N", help="override the plan's rounds (fewer than 3 warns)"
    )
    parser.add_argument(
        "--phase-s",
        type=float,
        metavar="S",
        help="override phases.duration_s (each window's length; for a quick smoke run)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON summary on stdout (progress goes to stderr)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="load worker processes, one schedule shared out (default: one per core when the "
        "plan needs more than one core, else 1: in-process)",
    )
    parser.add_argument(
        "--gpu",
        metavar="NAME",
        help="the target's card (catalog name) for the capacity plan stored "
        "with the run, when the plan's capacity: block does not name it",
    )
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="GIB",
        help="usable memory per GPU for the capacity plan (a card not in the catalog)",
    )
    parser.add_argument(
        "--i-understand-this-is-production",
        dest="allow_production",
        action="store_true",
        help="allow a plan whose target.environment is production",
    )


def summary(r: RunResult, store_url: str) -> dict[str, Any]:
    """The --json document: run_id, status, exit_code, stop_reason, stop_condition, requests,
    errors, elapsed_s, notes, store (password hidden), rollbacks [{command, exit_code}]; `run` adds
    received / stored (rows per table: produced / counted back from the store), store_complete
    and store_failure."""
    from vramlab.store import describe_url

    return {
        "run_id": r.run_id,
        "status": r.status,
        "exit_code": r.exit_code,
        "stop_reason": None if r.stop_reason is None else r.stop_reason.message,
        "stop_condition": None if r.stop_reason is None else r.stop_reason.condition,
        "requests": r.requests,
        "errors": r.errors,
        "elapsed_s": round(r.elapsed_s, 3),
        "notes": list(r.notes),
        "store": describe_url(store_url),
        "rollbacks": [{"command": b.command, "exit_code": b.exit_code} for b in r.rollbacks],
    }


def report_hint(run_id: str, db_arg: str | None, store_url: str, out: str = "report.html") -> str:
    """The `vramlab report` command that finds this run again: with --db (password hidden) unless the
    store is the default one the report command would open anyway."""
    import os
    import shlex

    from vramlab.store import describe_url

    cmd = f"vramlab report {run_id} --format html -o {out}"
    given = db_arg or os.environ.get("VRAMLAB_DB")
    if given is None:
        return cmd
    return f"{cmd} --db {shlex.quote(describe_url(store_url))}"


def run(args: argparse.Namespace) -> int:
    from vramlab.cli.outputs import check_store
    from vramlab.errors import ConfigError
    from vramlab.experiment.kind import RunOptions
    from vramlab.experiment.progress import make_progress
    from vramlab.experiment.start import run_plan_file
    from vramlab.run.session import Card
    from vramlab.store import open_store

    card = Card(args.gpu, args.gpu_memory_gib).checked()
    if args.workers is not None and not 1 <= args.workers <= 256:
        raise ConfigError(f"--workers must be between 1 and 256, got {args.workers}")
    check_store(args.db)  # before the plan starts anything
    progress = make_progress(sys.stderr if args.json else sys.stdout)
    try:
        out = run_plan_file(
            args.plan,
            open_store=lambda: open_store(args.db),
            rounds=args.rounds,
            allow_production=args.allow_production,
            subscribers=[progress],
            phase_s=args.phase_s,
            options=RunOptions(workers=args.workers),
            card=card,
        )
    finally:
        progress.close()
    _say(args, out)
    return int(out.exit_code())


def _say(args: argparse.Namespace, out: Any) -> None:
    """The run's summary: one line (or --json), what the store holds, how to render it."""
    s = summary(out.result, out.store_url)
    s.update(
        received=out.received,
        stored=out.stored,
        store_complete=out.store_complete,
        store_failure=out.store_failure,
        unsaved=None if out.spooled is None else {"file": out.spooled[0], "rows": out.spooled[1]},
    )
    error = out.error_line("run")
    if error is not None:
        print(error, file=sys.stderr)
    if not out.store_complete:
        print(
            f"vramlab run: error: run {s['run_id']} was not stored completely"
            + (f" ({out.store_failure})" if out.store_failure else "")
            + f"; {out.stored_line()}",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(s, indent=2))
        return
    print(
        f"run {s['run_id']}: {s['status']}, {s['requests']} requests, {s['errors']} errors, "
        f"{s['elapsed_s']:.1f} s" + (f" ({s['stop_reason']})" if s["stop_reason"] else "")
    )
    if out.store_complete:
        print(f"stored in {s['store']}; render it with: {report_hint(s['run_id'], args.db, out.store_url)}")
    else:
        print(f"{out.stored_line()} in {s['store']}")
