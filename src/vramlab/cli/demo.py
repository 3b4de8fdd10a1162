"""Start the rehearsal server, run a small three-round plan against it, write an HTML report;
then run the OOM drill (examples/oom-drill.yaml) against a sim of its own and write the incident
report.

Needs no arguments: the store (./vramlab.db unless --db or $VRAMLAB_DB) and the reports
(./vramlab-demo.html unless -o, ./vramlab-incident.html unless --incident) go under the current
directory. Takes under a minute; --no-drill skips the drill. The sims are stopped on exit and on
Ctrl-C, and the drill's rollback runs however it ends.
"""

from __future__ import annotations

import argparse
import sys

from vramlab.cli.runs import store_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", type=store_arg, metavar="URL", help="store (default $VRAMLAB_DB, else ./vramlab.db)"
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        default="vramlab-demo.html",
        help="HTML report path (default ./vramlab-demo.html)",
    )
    parser.add_argument(
        "--incident",
        metavar="FILE",
        default="vramlab-incident.html",
        help="the OOM drill's incident report (default ./vramlab-incident.html)",
    )
    parser.add_argument(
        "--no-drill",
        dest="drill",
        action="store_false",
        help="skip the OOM drill (examples/oom-drill.yaml) after the experiment",
    )


def _drill_progress(ev: object) -> None:
    """The drill's milestones, one line each, as `vramlab drill` prints them."""
    from vramlab.cli.drill import PROGRESS

    if getattr(ev, "kind", "") in PROGRESS:
        print(
            f"  {getattr(ev, 't_s', 0.0):7.2f} s  {getattr(ev, 'kind', ''):<20} {getattr(ev, 'message', '')[:100]}",
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vramlab.cli.outputs import check_writable
    from vramlab.demo.experiment import run_demo
    from vramlab.experiment.progress import make_progress
    from vramlab.store import describe_url

    check_writable(args.output, "report")  # both reports, before the sim starts
    if args.drill:
        check_writable(args.incident, "incident report")
    progress = make_progress(sys.stdout)
    print("vramlab demo: starting the sim (llama-3.1-8b-instruct on a simulated H100 80GB) ...", flush=True)
    try:
        res = run_demo(
            args.db,
            Path(args.output),
            subscribers=[progress],
            on_sim=lambda url: print(f"vramlab demo: sim up at {url}", flush=True),
        )
    finally:
        progress.close()
    r = res.result
    print(
        f"run {r.run_id}: {r.status}, {r.requests} requests, {r.errors} errors, {res.elapsed_s:.0f} s in all"
    )
    if not args.drill:
        print(f"store:  {describe_url(res.store_url)}")
        print(f"report: {res.report_path.resolve()}")
        print(f"next:   vramlab report {r.run_id} --format md   |   vramlab runs")
        return r.exit_code
    from vramlab.demo.drill import run_drill_demo

    print(
        "vramlab demo: OOM drill (examples/oom-drill.yaml): context ramp on a simulated L4 until it runs out "
        "of memory, then recovery ...",
        flush=True,
    )
    try:
        d = run_drill_demo(
            args.db,
            Path(args.incident),
            subscribers=[_drill_progress],
            on_run=lambda rid: print(
                f"drill run {rid} (Ctrl-C stops it; the rollback still runs)", flush=True
            ),
        )
    except KeyboardInterrupt:
        print(
            "vramlab demo: drill interrupted; rollback done; the partial drill is in the store",
            file=sys.stderr,
        )
        return 130
    print(f"drill {d.run_id}: {d.status}, {d.elapsed_s:.0f} s: {d.summary}")
    print(f"store:           {describe_url(res.store_url)}")
    print(f"report:          {res.report_path.resolve()}")
    print(f"incident report: {d.report_path.resolve()}")
    print(f"next:   vramlab report {d.run_id} --format md   |   vramlab runs")
    return r.exit_code or d.exit_code
