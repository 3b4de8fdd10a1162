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


Block = Text | Bullets | Table | Chart
