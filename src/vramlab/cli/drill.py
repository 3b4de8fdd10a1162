"""Run an OOM drill: ramp until the target fails (or the ceiling), detect, recover, write the incident report.

The target must be declared `environment: test`; anything else is refused unless
--i-understand-this-is-not-a-test-environment is given. Stop conditions are always armed, and
the drill undoes what it changed (balloon released, co-loaded models and the sim it started
stopped, the plan's rollback commands run) on completion, on stop, on errors and on Ctrl-C.
Everything goes to the store (kind "drill"); `vramlab report ID` renders it again later.
Exit codes (the same policy as `vramlab run`, docs/drills.md): 0 the drill ran and every failure
recovered (or nothing failed); 1 a failed round did not recover by the report's verdict (not
serving again, health still failing or P95 not back within the limit and observation: a hang, a
refused restart), or the drill failed once started; 3 stopped early (its baseline breached the
plan's error threshold, nothing was ramped; its wall clock ran out); 130 Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vramlab.cli.runs import store_arg

# the same string as vramlab.drill.target.OVERRIDE_FLAG (a test keeps them equal); literal here so
# `vramlab drill --help` does not import pydantic
OVERRIDE_FLAG = "--i-understand-this-is-not-a-test-environment"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="drill plan (YAML), e.g. examples/oom-drill.yaml")
    parser.add_argument(
        "--db",
        type=store_arg,
        help="store: a SQLite path or postgresql:// URL (default: $VRAMLAB_DB or ./vramlab.db)",
    )
    parser.add_argument(
        "-o", "--output", help="incident report file (default: incident-RUN_ID.md; .html for HTML)"
    )
    parser.add_argument("--json", action="store_true", help="print the incident figures as JSON")
    parser.add_argument(
        OVERRIDE_FLAG,
        dest="not_test",
        action="store_true",
        help="act on a target that is not declared environment: test (you are breaking it on purpose)",
    )
    parser.add_argument(
        "--url", help="attach to an already running target at this URL instead of starting one"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--gpu",
        metavar="NAME",
        help="the target's card (catalog name) for the capacity plan stored "
        "with the drill, when the plan's capacity: block does not name it",
    )
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="GIB",
        help="usable memory per GPU for the capacity plan (a card not in the catalog)",
    )


PROGRESS = (
    "step",
    "detect",
    "fault",
    "mitigation",
    "recovered",
    "not_recovered",
    "ceiling",
    "rollback",
    "waiting_for_operator",
    "stop_condition",
    "retry_storm",
    "cotenant_oom",
    "engine",
    "race",
    "ledger",
    "health_path",
    "target_ready",
    "process_exit",
    "failure_mode",
    "stopped",
)


def _progress(ev: object) -> None:
    """One line per timeline milestone, so an operator (or a test) can follow the drill live."""
    kind = getattr(ev, "kind", "")
    if kind in PROGRESS:
        print(
            f"  {getattr(ev, 't_s', 0.0):7.2f} s  {kind:<20} {getattr(ev, 'message', '')}",
            file=sys.stderr,
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    from vramlab.cli.outputs import check_store, check_writable
    from vramlab.drill.start import run_drill
    from vramlab.drill.target import check_environment
    from vramlab.run.session import Card
    from vramlab.store import open_store

    # the default report lands in this folder: checked before the drill, not after it
    check_writable(args.output or "incident-XXXXXXXX.md", "incident report")
    plan = _plan(args)
    card = Card(args.gpu, args.gpu_memory_gib).checked()
    check_environment(plan.target, args.not_test)  # refuse before the store or the target is touched
    check_store(args.db or plan.store)
    for line in [*plan.old_name_notes(), *filter(None, [plan.ramp.capped_note()])]:  # said once; stored too
        print(f"vramlab drill: note: {line}", file=sys.stderr)
    with open_store(args.db or plan.store) as store:
        try:
            out = run_drill(
                plan,
                store,
                override_env=args.not_test,
                card=card,
                subscribers=[] if args.quiet else [_progress],
                on_run=lambda rid: print(
                    f"drill {plan.name}: run {rid} (stop with Ctrl-C; the rollback still runs)",
                    file=sys.stderr,
                    flush=True,
                ),
            )
        except KeyboardInterrupt:  # before the run was recorded
            print("vramlab drill: interrupted before the drill started; nothing was stored", file=sys.stderr)
            return 130
        return _outcome(args, args.db or plan.store, out, store)


def _plan(args: argparse.Namespace) -> Any:
    """The drill plan, attached to an already running target with --url."""
    from vramlab.drill.plan import load_plan

    plan = load_plan(args.plan)
    if args.url:
        plan = plan.model_copy(
            update={"target": plan.target.model_copy(update={"base_url": args.url, "sim": None})}
        )
    return plan


def _outcome(args: argparse.Namespace, db: str | None, out: Any, store: Any) -> int:
    """What the drill got, said once: the incident report, its summary and the recovery verdict."""
    session, run_id = out.session, out.run_id
    if out.status == "interrupted":
        print(
            f"vramlab drill: interrupted; rollback done; partial run {run_id} is in the store",
            file=sys.stderr,
        )
        return int(session.exit_code())
    error = session.error_line("drill")
    if error is not None:
        print(error, file=sys.stderr)
        return int(session.exit_code())
    if not session.store_complete:  # no drill is reported as completed with fewer rows than it produced
        print(
            f"vramlab drill: error: run {run_id} was not stored completely"
            + (f" ({session.store_failure})" if session.store_failure else "")
            + f"; {session.stored_line()}",
            file=sys.stderr,
        )
        return int(session.exit_code())
    from vramlab.report import load_context
    from vramlab.report.verdict import recovery_verdict

    ctx = load_context(store, run_id)
    report = _write_report(args, db, ctx, run_id, store.url)
    lost = recovery_verdict(ctx, out.unrecovered_rounds)
    if lost:
        # the drill ran, but the target did not come back (a hang, a refused restart, P95 never back): not a pass
        for line in lost.values():
            print(f"vramlab drill: NOT recovered: {line}", file=sys.stderr)
        print(
            f"vramlab drill: the target was NOT recovered in round(s) {', '.join(map(str, sorted(lost)))}; "
            f"exit 1; see {report}",
            file=sys.stderr,
        )
    return int(session.exit_code(recovered=not lost))


def _write_report(args: argparse.Namespace, db: str | None, ctx: Any, run_id: str, store_url: str) -> str:
    """The incident report file, then the summary (or --json) on stdout; the report's path."""
    from vramlab.cli.outputs import write_output
    from vramlab.redact import redact
    from vramlab.report import render
    from vramlab.report.incident import incident_json, summary_line

    out = args.output or f"incident-{run_id}.md"
    write_output(
        out,
        redact(render(ctx, "html" if out.endswith((".html", ".htm")) else "md")),
        "incident report",
        f"drill run {run_id} is in the store: `vramlab report {run_id}` renders it again",
    )
    if args.json:
        import json

        print(json.dumps(incident_json(ctx), indent=2, default=str))
    else:
        print(f"{run_id}: {summary_line(ctx)}")
        from vramlab.cli.run import report_hint

        again = report_hint(run_id, db, store_url, "incident.html")
        print(f"incident report: {out}   (again: {again})")
    return out
