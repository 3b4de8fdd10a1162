"""Run an OOM drill: ramp until the target fails (or the ceiling), detect, recover, write the incident report.

The target must be declared `environment: test`; anything else is refused unless
--i-understand-this-is-not-a-test-environment is given. Stop conditions are always armed, and
the drill undoes what it changed (balloon released, co-loaded models and the sim it started
stopped, the plan's rollback commands run) on completion, on stop, on errors and on Ctrl-C.
Everything goes to the store (kind "drill"); `vramlab report ID` renders it again later.
Exit: 0 the drill ran and every failure recovered (or nothing failed); 1 a failed round did not
recover by the report's verdict (not serving again, health still failing or P95 not back within the
limit and observation: a hang, a refused restart), or the drill itself failed, or its baseline
breached the plan's error threshold (nothing was ramped); 130 Ctrl-C.
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


def _with_card(plan: Any, gpu: str | None, gpu_memory_gib: float | None) -> Any:
    """The plan with --gpu / --gpu-memory-gib in its capacity: block where the block names no card."""
    from pydantic import ValidationError

    from vramlab.capacity import get_gpu
    from vramlab.errors import ConfigError
    from vramlab.experiment.plan import CapacityFacts

    if gpu is not None:
        get_gpu(gpu)  # an unknown card is bad input, before anything runs
    cap = plan.capacity.model_dump() if plan.capacity is not None else {}
    cap["gpu"] = cap.get("gpu") or gpu
    cap["gpu_memory_gib"] = cap.get("gpu_memory_gib") or gpu_memory_gib
    try:
        return plan.model_copy(update={"capacity": CapacityFacts.model_validate(cap)})
    except ValidationError as exc:
        raise ConfigError(f"--gpu-memory-gib: {exc.errors()[0]['msg']}") from None


def run(args: argparse.Namespace) -> int:
    from vramlab.cli.outputs import check_writable
    from vramlab.drill.plan import load_plan
    from vramlab.drill.runner import DrillRunner
    from vramlab.drill.session import run_drill
    from vramlab.drill.target import check_environment
    from vramlab.report import load_context, render
    from vramlab.report.incident import incident_json, summary_line, unrecovered, verdict_line
    from vramlab.store import open_store

    if args.output:
        check_writable(args.output, "incident report")  # before the drill, not after it
    else:
        check_writable("incident-XXXXXXXX.md", "incident report")  # the default lands in this folder
    plan = load_plan(args.plan)
    if args.url:
        plan = plan.model_copy(
            update={"target": plan.target.model_copy(update={"base_url": args.url, "sim": None})}
        )
    if args.gpu is not None or args.gpu_memory_gib is not None:
        plan = _with_card(plan, args.gpu, args.gpu_memory_gib)
    check_environment(plan.target, args.not_test)  # refuse before the store or the target is touched
    from vramlab.cli.outputs import check_store

    check_store(args.db or plan.store)
    for line in [*plan.old_name_notes(), *filter(None, [plan.ramp.capped_note()])]:  # said once; stored too
        print(f"vramlab drill: note: {line}", file=sys.stderr)
    store = open_store(args.db or plan.store)
    runner = DrillRunner(plan, store, override_env=args.not_test)
    print(
        f"drill {plan.name}: run {runner.run_id} (stop with Ctrl-C; the rollback still runs)",
        file=sys.stderr,
        flush=True,
    )
    if not args.quiet:
        runner.hook.add(_progress)
    try:
        result = run_drill(runner)
    except KeyboardInterrupt:
        print(
            f"vramlab drill: interrupted; rollback done; partial run {runner.run_id} is in the store",
            file=sys.stderr,
        )
        return 130
    acct = runner.recorder.accounting()
    if not acct.complete:  # no drill is reported as completed with fewer rows than it produced
        print(
            f"vramlab drill: error: run {result.run_id} was not stored completely"
            + (f" ({acct.failure})" if acct.failure else "")
            + f"; {acct.line()}",
            file=sys.stderr,
        )
        return 1
    ctx = load_context(store, result.run_id)
    out = args.output or f"incident-{result.run_id}.md"
    from vramlab.cli.outputs import write_output
    from vramlab.redact import redact

    write_output(
        out,
        redact(render(ctx, "html" if out.endswith((".html", ".htm")) else "md")),
        "incident report",
        f"drill run {result.run_id} is in the store: `vramlab report {result.run_id}` renders it again",
    )
    if args.json:
        import json

        print(json.dumps(incident_json(ctx), indent=2, default=str))
    else:
        print(f"{result.run_id}: {summary_line(ctx)}")
        from vramlab.cli.run import report_hint

        again = report_hint(result.run_id, args.db or plan.store, store.url, "incident.html")
        print(f"incident report: {out}   (again: {again})")
    # one verdict: the report's (serving, health 200 and P95 back), whatever the live lines said
    lost = {r.round or 0: verdict_line(r) for r in unrecovered(ctx)}
    lost.update(
        {
            r: f"round {r}: not serving again within the recovery limit"
            for r in result.unrecovered_rounds
            if r not in lost
        }
    )
    if lost:
        # the drill ran, but the target did not come back (a hang, a refused restart, P95 never back): not a pass
        for line in lost.values():
            print(f"vramlab drill: NOT recovered: {line}", file=sys.stderr)
        print(
            f"vramlab drill: the target was NOT recovered in round(s) {', '.join(map(str, sorted(lost)))}; exit 1; "
            f"see {out}",
            file=sys.stderr,
        )
        return 1
    return 0 if result.status == "completed" else 1
