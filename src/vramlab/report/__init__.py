"""Reports rendered from the store alone: Markdown, self-contained HTML, JSON.

    from vramlab.report import load_context, render
    with open_store(url) as store:
        text = render(load_context(store, "7f3a"), "html")

Sections are listed per module (`SECTIONS`, gathered by `vramlab.report.sections.registered`);
a caller adds its own for one document (`render(ctx, fmt, extra=[...])`) without touching the
renderers or any other report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlab.records.store import Store
    from vramlab.report.sections import ReportContext, Section

FORMATS = ("md", "html", "json")


def load_context(store: Store, run_id_or_prefix: str) -> ReportContext:
    """Read one run and everything stored with it, and analyse it. Reads only; runs nothing."""
    from vramlab.report.sections import ReportContext

    run = store.get_run(run_id_or_prefix)
    requests, samples, events = (
        store.requests(run.run_id),
        store.samples(run.run_id),
        store.events(run.run_id),
    )
    problems = getattr(store, "read_problems", None)
    if problems:  # corrupt rows were left out: the report says so where it lists the run's notes
        run = run.model_copy(update={"notes": [*run.notes, problems.summary()]})
    return ReportContext.build(run, requests, samples, events)


def render(ctx: ReportContext, fmt: str = "md", extra: Sequence[Section] = ()) -> str:
    from vramlab.report import html, markdown
    from vramlab.report import json as json_report
    from vramlab.report.sections import build_document

    if fmt not in FORMATS:
        from vramlab.errors import ConfigError

        raise ConfigError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    doc = build_document(ctx, extra)
    if fmt == "md":
        return markdown.render(doc)
    if fmt == "html":
        return html.render(doc)
    return json_report.render(ctx, doc)
