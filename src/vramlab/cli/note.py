"""Add an operator note to a run's timeline (works while a drill runs, from another terminal).

    vramlab note 7f3a "restarted vllm with --max-num-seqs 64"

The note goes into the store as a timeline event stamped with the time since the run started.
During a drill with `recovery: manual`, the first note after the failure is the mitigation.
"""

from __future__ import annotations

import argparse

from vramlab.cli.runs import store_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", help="run id or a unique prefix of it (see `vramlab runs`)")
    parser.add_argument("text", help="what you saw or did, one line")
    parser.add_argument("--by", help="who (default: $USER)")
    parser.add_argument(
        "--db",
        type=store_arg,
        help="store: a SQLite path or postgresql:// URL (default: $VRAMLAB_DB or ./vramlab.db)",
    )


def run(args: argparse.Namespace) -> int:
    import getpass
    import time

    from vramlab.errors import VramlabError
    from vramlab.records import EventRecord
    from vramlab.records.events import EventKind
    from vramlab.store import open_store

    text = " ".join(args.text.split())
    if not text:
        raise VramlabError("the note is empty")
    with open_store(args.db) as store:
        run = store.get_run(args.run_id)
        t_s = max(0.0, time.time() - run.started_at)
        who = args.by or getpass.getuser()
        store.add_events(
            run.run_id,
            [
                EventRecord(
                    run_id=run.run_id,
                    t_s=t_s,
                    kind=EventKind.NOTE,
                    message=text[:500],
                    data={"by": who, "at": time.time()},
                )
            ],
        )
    print(f"noted on run {run.run_id} at +{t_s:.1f} s")
    return 0
