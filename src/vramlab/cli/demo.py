"""Start the rehearsal server, run a small three-round plan against it, write an HTML report.

Needs no arguments: the store (./vramlab.db unless --db or $VRAMLAB_DB) and the report
(./vramlab-demo.html unless -o) go under the current directory. Takes under a minute; the sim
is stopped on exit and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="URL", help="store (default $VRAMLAB_DB, else ./vramlab.db)")
    parser.add_argument("-o", "--output", metavar="FILE", default="vramlab-demo.html",
                        help="HTML report path (default ./vramlab-demo.html)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vramlab.experiment.demo import run_demo
    from vramlab.experiment.progress import make_progress
    from vramlab.store import describe_url

    progress = make_progress(sys.stdout)
    print("vramlab demo: starting the sim (llama-3.1-8b-instruct on a simulated H100 80GB) ...", flush=True)
    try:
        res = run_demo(args.db, Path(args.output), subscribers=[progress],
                       on_sim=lambda url: print(f"vramlab demo: sim up at {url}", flush=True))
    finally:
        progress.close()
    r = res.result
    print(f"run {r.run_id}: {r.status}, {r.requests} requests, {r.errors} errors, {res.elapsed_s:.0f} s in all")
    print(f"store:  {describe_url(res.store_url)}")
    print(f"report: {res.report_path.resolve()}")
    print(f"next:   vramlab report {r.run_id} --format md   |   vramlab runs")
    return r.exit_code
