"""The report's building blocks: sections return these, each renderer draws them its own way."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str | None = None


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[float, float]]
    dashed: bool = False


@dataclass(frozen=True)
class Band:
    """A horizontal band (lo..hi on the y axis), e.g. the baseline P95 range across rounds."""

    label: str
    lo: float
    hi: float


@dataclass(frozen=True)
class Shade:
    """A vertical stripe (start..end on the x axis), e.g. a phase of the run."""

    label: str
    start: float
    end: float


@dataclass(frozen=True)
class Marker:
    """A vertical line at x with a short label, e.g. a stop condition or a rollback."""

    x: float
    label: str


@dataclass(frozen=True)
class Chart:
    """A line chart; Markdown shows its title and a pointer to the HTML report."""

    title: str
    x_label: str
    y_label: str
    series: list[Series]
    bands: list[Band] = field(default_factory=list)
    shades: list[Shade] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    y_min_zero: bool = True


@dataclass(frozen=True)
class Verdict:
    """The report's answer, first on its first screen: one headline with its figure, a status a
    renderer can colour, and the lines that say what it was judged by.

    status: "held" (the hypothesis held by its thresholds, a drill that failed nowhere),
    "not-held" (a threshold broke; a drill that failed and did not recover), "recovered" (a drill
    that failed and recovered) or "untested" (nothing to judge it by)."""

    status: str
    headline: str
    details: list[str] = field(default_factory=list)


Block = Text | Bullets | Table | Chart | Verdict
