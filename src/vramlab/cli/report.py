"""Render a stored run as Markdown, HTML or JSON, from the store alone (nothing is re-run).

ID may be any unique prefix of a run id (see `vramlab runs`). Without -o the report goes to
standard output.
"""

from __future__ import annotations

import argparse

from vramlab.cli.runs import add_db_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="run id or a unique prefix of it")
    parser.add_argument(
        "--format",
        choices=["md", "html", "json"],
        default=None,
        help="output format (default: from -o's extension, else md)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", default=None, help="write here instead of stdout")
    add_db_argument(parser)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from vramlab.cli.outputs import check_writable
    from vramlab.report import load_context, render
    from vramlab.store import open_store

    if args.output:
        check_writable(args.output, "report")
    fmt = args.format
    if fmt is None and args.output:
        fmt = {".html": "html", ".htm": "html", ".json": "json"}.get(Path(args.output).suffix.lower(), "md")
    with open_store(args.db) as store:
        ctx = load_context(store, args.id)
    from vramlab.redact import redact

    text = redact(render(ctx, fmt or "md"))  # a store written before redaction existed is masked too
    from vramlab.cli.runs import unread_rows

    if not args.output:
        sys.stdout.write(text)
        return unread_rows(store, "report", ctx.problems)
    from vramlab.cli.outputs import write_output

    out = Path(args.output)
    write_output(out, text, "report", f"run {ctx.run.run_id} is in the store as it was")
    state = "" if ctx.analysis.complete else " (incomplete run)"
    print(f"wrote {out} ({fmt or 'md'}, run {ctx.run.run_id}{state})", file=sys.stderr)
    return unread_rows(store, "report", ctx.problems)
