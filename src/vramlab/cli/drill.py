"""Run an OOM drill: ramp until the target fails (or the ceiling), detect, recover, write the incident report.

The target must be declared `environment: test`; anything else is refused unless
--i-understand-this-is-not-a-test-environment is given. Stop conditions are always armed, and
the drill undoes what it changed (balloon released, co-loaded models and the sim it started
stopped, the plan's rollback commands run) on completion, on stop, on errors and on Ctrl-C.
Everything goes to the store (kind "drill"); `vramlab report ID` renders it again later.
Exit: 0 the drill ran and every failure recovered (or nothing failed); 1 a failed round did not
recover within the limit (a hang, a refused restart), or the drill itself failed; 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys

# the same string as vramlab.drill.target.OVERRIDE_FLAG (a test keeps them equal); literal here so
# `vramlab drill --help` does not import pydantic
OVERRIDE_FLAG = "--i-understand-this-is-not-a-test-environment"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="drill plan (YAML), e.g. examples/oom-drill.yaml")
    parser.add_argument("--db", help="store: a SQLite path or postgresql:// URL (default: $VRAMLAB_DB or ./vramlab.db)")
    parser.add_argument("-o", "--output", help="incident report file (default: incident-RUN_ID.md; .html for HTML)")
    parser.add_argument("--json", action="store_true", help="print the incident figures as JSON")
    parser.add_argument(OVERRIDE_FLAG, dest="not_test", action="store_true",
                        help="act on a target that is not declared environment: test (you are breaking it on purpose)")
    parser.add_argument("--url", help="attach to an already running target at this URL instead of starting one")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


PROGRESS = ("step", "detect", "fault", "mitigation", "recovered", "not_recovered", "ceiling", "rollback",
            "waiting_for_operator", "stop_condition", "retry_storm", "cotenant_oom", "engine", "race", "ledger",
            "health_path", "target_ready", "process_exit", "failure_mode", "stopped")


def _progress(ev: object) -> None:
    """One line per timeline milestone, so an operator (or a test) can follow the drill live."""
    kind = getattr(ev, "kind", "")
    if kind in PROGRESS:
        print(f"  {getattr(ev, 't_s', 0.0):7.2f} s  {kind:<20} {getattr(ev, 'message', '')[:120]}", file=sys.stderr,
              flush=True)


def run(args: argparse.Namespace) -> int:
    from vramlab.cli.outputs import check_writable
    from vramlab.drill.plan import load_plan
    from vramlab.drill.runner import DrillRunner
    from vramlab.drill.session import run_drill
    from vramlab.drill.target import check_environment
    from vramlab.report import load_context, render
    from vramlab.report.incident import incident_json, summary_line
    from vramlab.store import open_store

    if args.output:
        check_writable(args.output, "incident report")  # before the drill, not after it
    else:
        check_writable("incident-XXXXXXXX.md", "incident report")  # the default lands in this folder
    plan = load_plan(args.plan)
    if args.url:
        plan = plan.model_copy(update={"target": plan.target.model_copy(update={"base_url": args.url, "sim": None})})
    check_environment(plan.target, args.not_test)  # refuse before the store or the target is touched
    from vramlab.cli.outputs import check_store

    check_store(args.db or plan.store)
    store = open_store(args.db or plan.store)
    runner = DrillRunner(plan, store, override_env=args.not_test)
    print(f"drill {plan.name}: run {runner.run_id} (stop with Ctrl-C; the rollback still runs)", file=sys.stderr,
          flush=True)
    if not args.quiet:
        runner.hook.add(_progress)
    try:
        result = run_drill(runner)
    except KeyboardInterrupt:
        print(f"vramlab drill: interrupted; rollback done; partial run {runner.run_id} is in the store", file=sys.stderr)
        return 130
    acct = runner.recorder.accounting()
    if not acct.complete:  # no drill is reported as completed with fewer rows than it produced
        print(f"vramlab drill: error: run {result.run_id} was not stored completely"
              + (f" ({acct.failure})" if acct.failure else "") + f"; {acct.line()}", file=sys.stderr)
        return 1
    ctx = load_context(store, result.run_id)
    out = args.output or f"incident-{result.run_id}.md"
    from vramlab.cli.outputs import write_output
    from vramlab.redact import redact

    write_output(out, redact(render(ctx, "html" if out.endswith((".html", ".htm")) else "md")), "incident report",
                 f"drill run {result.run_id} is in the store: `vramlab report {result.run_id}` renders it again")
    if args.json:
        import json

        print(json.dumps(incident_json(ctx), indent=2, default=str))
    else:
        print(f"{result.run_id}: {summary_line(ctx)}")
        from vramlab.cli.run import report_hint

        again = report_hint(result.run_id, args.db or plan.store, store.url, "incident.html")
        print(f"incident report: {out}   (again: {again})")
    if result.unrecovered_rounds:
        # the drill ran, but the target did not come back (a hang, a refused restart): not a pass
        rounds = ", ".join(str(r) for r in result.unrecovered_rounds)
        print(f"vramlab drill: the target was NOT recovered in round(s) {rounds}; see {out}", file=sys.stderr)
        return 1
    return 0 if result.status == "completed" else 1

