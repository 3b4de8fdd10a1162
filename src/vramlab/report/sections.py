"""The section registry: what a report contains, in order, and for which runs.

A section is a function from the report context to blocks (and optionally to JSON data). The
built-in ones live in this package: `core_sections.py` for every run, `incident.py` and
`colocation.py` for runs of kind "drill" (they read only the stored records and the analysis, so
the report never imports the drill); each module lists its own as a constant `SECTIONS` tuple.
Other code adds its own for one document, without changing what any other report holds:

    from vramlab.report.sections import Section, build_document
    mine = Section("extra", "Extra", my_blocks, order=25, applies=lambda ctx: ctx.run.kind == "drill")
    doc = build_document(ctx, extra=[mine])

The answer comes first (`answer.py`, order 1: the verdict, plan against measured, the key chart);
sections marked `appendix` (the plan as run, the environment) come last, whatever their order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vramlab.analysis.run import RunAnalysis, analyze_run
from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
from vramlab.report.blocks import Block, Text

T = TypeVar("T")


@dataclass(frozen=True)
class ReportContext:
    """Everything stored about one run, plus its analysis. Sections read only this."""

    run: RunRecord
    requests: Sequence[RequestRecord]
    samples: Sequence[SampleRecord]
    events: Sequence[EventRecord]
    analysis: RunAnalysis
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """*compute*'s value, computed once for this context (several sections read one analysis)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]  # type: ignore[no-any-return]

    @property
    def problems(self) -> list[str]:
        """Sections the stored data could not build (a corrupt row past what the store's read caught)."""
        return self.memo("problems", list)

    @property
    def plan(self) -> dict[str, Any]:
        """The run's stored plan in the one vocabulary (vramlab.plandoc): a run stored before the
        names changed reads like a new one."""
        from vramlab.plandoc import stored_plan

        return self.memo("plan", lambda: stored_plan(self.run.plan, self.run.kind))

    @classmethod
    def build(
        cls,
        run: RunRecord,
        requests: Sequence[RequestRecord],
        samples: Sequence[SampleRecord],
        events: Sequence[EventRecord],
    ) -> ReportContext:
        return cls(run, requests, samples, events, analyze_run(run, requests, samples, events))


def _always(_ctx: ReportContext) -> bool:
    return True


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    build: Callable[[ReportContext], list[Block]]
    order: float = 100
    applies: Callable[[ReportContext], bool] = _always
    data: Callable[[ReportContext], Any] | None = None  # JSON-ready; None: the JSON report skips it
    # Reference a reader looks up rather than reads (the plan as run, the environment): rendered
    # after every other section, under an "Appendix" heading, whatever its order.
    appendix: bool = False


@dataclass(frozen=True)
class RenderedSection:
    id: str
    title: str
    blocks: list[Block]
    data: Any = None
    appendix: bool = False


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    sections: list[RenderedSection] = field(default_factory=list)


def registered(extra: Sequence[Section] = ()) -> list[Section]:
    """The built-in sections and *extra* (one of the same id replaces the built-in), in order. Each
    module's sections are a constant tuple (`SECTIONS`): nothing is registered at run time."""
    # Imported here, not at the top: each of them imports this module for Section and ReportContext.
    from vramlab.report import (
        answer,
        charts,
        colocation,
        composition,
        core_sections,
        incident,
        slo_search,
        soak,
        tenants,
    )

    by_id = {
        s.id: s
        for s in (
            *answer.SECTIONS,
            *core_sections.SECTIONS,
            *charts.SECTIONS,
            *composition.SECTIONS,
            *incident.SECTIONS,  # drill runs: the incident
            *colocation.SECTIONS,
            *slo_search.SECTIONS,  # change.search runs
            *soak.SECTIONS,  # change.soak runs
            *tenants.SECTIONS,  # conversations with tenants
            *extra,
        )
    }
    return sorted(by_id.values(), key=lambda s: (s.order, s.id))


def build_document(ctx: ReportContext, extra: Sequence[Section] = ()) -> Document:
    """The sections that apply (the built-in ones and *extra*), in order: the answer first, the
    appendix sections last."""
    run = ctx.run
    state = "" if ctx.analysis.complete else " (incomplete)"
    doc = Document(
        title=f"vramlab {run.kind} {run.run_id}: {run.name}",
        subtitle=f"status {run.status}{state}",
    )
    for section in sorted(registered(extra), key=lambda s: s.appendix):  # stable: order kept within each part
        try:
            if not section.applies(ctx):
                continue
            blocks = section.build(ctx)
            data = section.data(ctx) if blocks and section.data is not None else None
        except DATA_ERRORS as exc:  # one section, not the report: the rest still render
            why = f"section {section.title!r} could not be built from the stored data ({type(exc).__name__}: {exc})"
            ctx.problems.append(why[:300])
            blocks, data = [Text(why[:300] + "; the rest of the report is complete.")], None
        if blocks:
            doc.sections.append(RenderedSection(section.id, section.title, blocks, data, section.appendix))
    return doc


# What a stored value of the wrong shape raises in a section (a row edited by hand, a bug's
# leftovers); anything else is vramlab's own bug and still ends the command (exit 70).
DATA_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError)
