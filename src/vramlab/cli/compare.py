"""Compare two stored runs metric by metric (medians over rounds, per phase and step).

Refuses (exit 2) when the fixed parts differ (plan hash, engine, engine version, model, GPU):
such runs are different experiments. --force compares anyway and says what differs.
"""

from __future__ import annotations

import argparse

from vramlab.cli.runs import add_db_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="first run id (or unique prefix): the reference")
    parser.add_argument("b", metavar="B", help="second run id (or unique prefix)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--force", action="store_true", help="compare even when the fixed parts differ")
    add_db_argument(parser)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from vramlab.analysis.compare import compare_runs
    from vramlab.errors import VramlabError
    from vramlab.report import load_context
    from vramlab.report.comparison import render_text, to_json
    from vramlab.store import open_store

    with open_store(args.db) as store:
        a, b = load_context(store, args.a), load_context(store, args.b)
    comp = compare_runs(a.analysis, b.analysis)
    if not comp.comparable:
        what = "; ".join(comp.differences)
        if not args.force:
            raise VramlabError(
                f"runs {comp.a_id} and {comp.b_id} differ in their fixed parts ({what}); "
                "pass --force to compare anyway"
            )
        print(
            f"vramlab compare: warning: fixed parts differ ({what}); deltas may not mean what they seem",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(to_json(comp), indent=2))
    else:
        sys.stdout.write(render_text(comp))
    from vramlab.cli.runs import unread_rows

    return unread_rows(store, "compare")
