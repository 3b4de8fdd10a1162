"""Compare two stored runs metric by metric (medians over rounds, per phase and step).

Two runs that differ only in the engine's version (or only in the variable --vary names) are a
regression comparison: memory composition and latency side by side, the plan's predicted change
beside the measured one, and a verdict (regressed, improved, no change). Runs that differ in more
are refused (exit 2): they are different experiments. --force compares them anyway and says what
differs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from vramlab.cli.runs import add_db_argument

if TYPE_CHECKING:
    from vramlab.analysis.regression import Difference
    from vramlab.report.sections import ReportContext


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="first run id (or unique prefix): the reference")
    parser.add_argument("b", metavar="B", help="second run id (or unique prefix)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--force", action="store_true", help="compare even when the fixed parts differ")
    parser.add_argument(
        "--vary",
        metavar="FIELD",
        help="the one thing the runs differ in, for a regression comparison: a fixed key "
        "(engine_version, model, gpu_name) or a plan field (load.max_concurrency, target.sim)",
    )
    add_db_argument(parser)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from vramlab.analysis.compare import compare_runs
    from vramlab.analysis.regression import differences, subject_of
    from vramlab.errors import VramlabError
    from vramlab.report import load_context
    from vramlab.report.comparison import render_text, to_json
    from vramlab.store import open_store

    with open_store(args.db) as store:
        a, b = load_context(store, args.a), load_context(store, args.b)
    comp = compare_runs(a.analysis, b.analysis)
    diffs = differences(a.analysis, b.analysis)
    subject = subject_of(diffs, args.vary) if (diffs or args.vary) else None
    if subject is not None:
        return _regression(store, a, b, subject, args.json)
    if args.vary:
        what = "; ".join(f"{d.key} {d.a!r} vs {d.b!r}" for d in diffs) or "nothing"
        raise VramlabError(f"runs {comp.a_id} and {comp.b_id} differ in more than {args.vary}: {what}")
    if not comp.comparable:
        what = "; ".join(comp.differences)
        if not args.force:
            raise VramlabError(
                f"runs {comp.a_id} and {comp.b_id} differ in their fixed parts ({what}); pass --vary FIELD "
                "when they differ in one thing you chose, or --force to compare anyway"
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


def _regression(store: Any, a: ReportContext, b: ReportContext, subject: Difference, as_json: bool) -> int:
    import json
    import sys

    from vramlab.analysis.regression import regression
    from vramlab.report import regression as text
    from vramlab.report.composition import composition_of

    ca = composition_of(a)
    cb = composition_of(b)
    r = regression(a.analysis, b.analysis, ca, cb, subject)
    changes = text.plan_changes(text.stored_plan(a.events), text.stored_plan(b.events))
    ids = a.run.run_id, b.run.run_id
    if as_json:
        print(json.dumps(text.to_json(r, *ids, changes), indent=2, default=str))
    else:
        sys.stdout.write(text.render_text(r, *ids, changes))
    from vramlab.cli.runs import unread_rows

    return unread_rows(store, "compare")
