"""The section registry: what a report contains, in order, and for which runs.

A section is a function from the report context to blocks (and optionally to JSON data). The
built-in ones live in this package: `core_sections.py` for every run, `incident.py` and
`colocation.py` for runs of kind "drill" (they read only the stored records and the analysis, so
the report never imports the drill). Other code adds its own with `register`:

    from vramlab.report.sections import Section, register
    register(Section("incident", "Incident", order=25, applies=lambda ctx: ctx.run.kind == "drill",
                     build=my_blocks, data=my_json))

The answer comes first (`answer.py`, order 1: the verdict, plan against measured, the key chart);
sections marked `appendix` (the plan as run, the environment) come last, whatever their order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vramlab.analysis.run import RunAnalysis, analyze_run
from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
from vramlab.report.blocks import Block

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


_REGISTRY: dict[str, Section] = {}
_builtins_loaded = False


def register(section: Section) -> Section:
    """Add (or replace, by id) a section."""
    _REGISTRY[section.id] = section
    return section


def registered() -> list[Section]:
    _load_builtins()
    return sorted(_REGISTRY.values(), key=lambda s: (s.order, s.id))


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    # Imported here, not at the top: each of them imports this module to register its sections.
    import vramlab.report.answer
    import vramlab.report.charts
    import vramlab.report.colocation
    import vramlab.report.composition
    import vramlab.report.core_sections
    import vramlab.report.incident  # noqa: F401  (drill runs: the incident)


def build_document(ctx: ReportContext) -> Document:
    """The sections that apply, in order: the answer first, the appendix sections last."""
    run = ctx.run
    state = "" if ctx.analysis.complete else " (incomplete)"
    doc = Document(
        title=f"vramlab {run.kind} {run.run_id}: {run.name}",
        subtitle=f"status {run.status}{state}",
    )
    for section in sorted(registered(), key=lambda s: s.appendix):  # stable: order kept within each part
        if not section.applies(ctx):
            continue
        blocks = section.build(ctx)
        if not blocks:
            continue
        data = section.data(ctx) if section.data is not None else None
        doc.sections.append(RenderedSection(section.id, section.title, blocks, data, section.appendix))
    return doc
