"""List stored runs, newest first.

Reads the store given by --db (default: $VRAMLAB_DB, else ./vramlab.db). With --json, prints a
list of objects with at least id, name, kind ("run" or "drill"), status and started_at.
A run stored as running whose process is gone (killed, host lost) shows as "died": its writer's
heartbeat stopped (HEARTBEAT column; "stored_status" and "heartbeat_at" in --json).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramlab.records import RunRecord


def store_arg(text: str) -> str:
    """`--db`'s type: an empty value is a mistake (a shell variable that was not set), never the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty store: give a file path, sqlite:///PATH or postgresql://... (or leave --db out)"
        )
    return text


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        type=store_arg,
        metavar="URL",
        default=None,
        help="store: a SQLite path or postgresql://... (default: $VRAMLAB_DB, else ./vramlab.db)",
    )


def unread_rows(store: Any, command: str, sections: Sequence[str] = ()) -> int:
    """After a command read the store: 1 and one line on stderr naming the corrupt rows it left
    out, or the report sections they broke (the rest were read and shown), else 0."""
    import sys

    problems = getattr(store, "read_problems", None)
    if not problems and not sections:
        return 0
    said = [problems.summary()] if problems else []
    said += sections[:2]
    print(f"vramlab {command}: warning: {'; '.join(said)}", file=sys.stderr)
    return 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--limit", type=int, default=50, metavar="N", help="at most N runs (default 50; 0 = all)"
    )
    parser.add_argument(
        "--kind",
        choices=["run", "experiment", "drill"],
        default=None,
        help="only runs of this kind (run and experiment are the same)",
    )
    add_db_argument(parser)


def run(args: argparse.Namespace) -> int:
    import json

    from vramlab.errors import ConfigError
    from vramlab.store import open_store

    if args.limit < 0:
        raise ConfigError("--limit must be 0 (all) or more")
    kind = {"run": "experiment"}.get(args.kind, args.kind)
    import time

    from vramlab.store.liveness import observed_status

    with open_store(args.db) as store:
        runs = store.list_runs(limit=args.limit, kind=kind)
        beats = store.liveness([r.run_id for r in runs])
    now = time.time()
    shown = {
        r.run_id: observed_status(r.status, r.started_at, *beats.get(r.run_id, (None, None, None)), now=now)
        for r in runs
    }
    if args.json:
        print(
            json.dumps(
                [
                    {
                        **_row(r),
                        "status": shown[r.run_id],
                        "stored_status": r.status,
                        "heartbeat_at": beats.get(r.run_id, (None,))[0],
                    }
                    for r in runs
                ],
                indent=2,
            )
        )
        return unread_rows(store, "runs")
    if not runs:
        print("no runs stored yet (start one with `vramlab run PLAN` or `vramlab demo`)")
        return unread_rows(store, "runs")
    from vramlab.report.fmt import utc

    table = [["ID", "KIND", "STATUS", "STARTED", "DURATION", "HEARTBEAT", "NAME", "MODEL"]]
    for r in runs:
        dur = "–" if r.ended_at is None else f"{r.ended_at - r.started_at:.0f} s"
        beat = beats.get(r.run_id, (None,))[0]
        beat_text = "–" if beat is None or r.status != "running" else f"{max(0.0, now - beat):.0f} s ago"
        table.append(
            [
                r.run_id,
                _public_kind(r.kind),
                shown[r.run_id],
                utc(r.started_at),
                dur,
                beat_text,
                r.name,
                str(r.fixed.get("model", "–")),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return unread_rows(store, "runs")


def _public_kind(kind: str) -> str:
    # The CLI contract names experiments "run"; the record keeps "experiment".
    return "run" if kind == "experiment" else kind


def _row(r: RunRecord) -> dict[str, Any]:
    return {
        "id": r.run_id,
        "name": r.name,
        "kind": _public_kind(r.kind),
        "status": r.status,
        "started_at": r.started_at,
        "ended_at": r.ended_at,
        "stop_reason": r.stop_reason,
        "plan_hash": r.plan_hash,
        "model": r.fixed.get("model"),
        "engine": r.fixed.get("engine"),
        "gpu_name": r.fixed.get("gpu_name"),
    }
