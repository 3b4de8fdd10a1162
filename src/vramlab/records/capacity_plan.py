"""The capacity plan and the start-up memory stored with a run, as typed records.

The runner stores both as events (`capacity_plan`, `startup_memory`: run/capacity_plan.py writes
them, docs/store-and-reports.md gives their JSON); the analysis, the reports and `vramlab calibrate`
read them through these types instead of by string keys. Reading is lenient in the way stored rows
need: a key an older vramlab did not write reads as None (or empty), and the stored document is kept
whole (``document``) so the JSON report repeats exactly what was stored.

A note about the plan (why it was not computed, or that it failed) is a `note` whose data says
``by: "capacity plan"`` (`CAPACITY_PLAN_NOTE`); rows from before that field are told by their text,
in `is_capacity_plan_note` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from vramlab.records.events import (
    EventKind,
    HasData,
    capacity_plan_data,
    note_data,
    startup_memory_data,
)

Document = Mapping[str, object]  # a stored JSON object, as read back

CAPACITY_PLAN_NOTE = "capacity plan"  # NoteData.by of a note about the capacity plan
_OLD_NOTE_PREFIX = "capacity plan:"  # how rows stored before NoteData.by said it


def as_int(value: object) -> int | None:
    """A stored number as an int (None for a missing or non-numeric value)."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def as_float(value: object) -> float | None:
    if isinstance(value, bool | int | float):
        return float(value)
    return None


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _doc(value: object) -> Document:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class PlannedComponent:
    """One component of the plan (`vramlab plan --json`'s components): its bytes and band."""

    name: str
    bytes: int
    low_bytes: int
    high_bytes: int

    @classmethod
    def from_json(cls, doc: Document) -> PlannedComponent:
        b = as_int(doc.get("bytes")) or 0
        low, high = as_int(doc.get("low_bytes")), as_int(doc.get("high_bytes"))
        return cls(str(doc.get("name", "")), b, b if low is None else low, b if high is None else high)


@dataclass(frozen=True)
class CapacityEstimate:
    """The estimate stored with a run (`vramlab plan --json`, docs/plan-json.md): what the analysis reads."""

    model: str | None
    gpu: str | None
    engine: str | None
    engine_version: str | None
    components: tuple[PlannedComponent, ...]
    kv_cache_tokens: int | None
    block_size: int | None
    max_model_len: int | None
    settings: Document
    document: Document  # the whole stored plan --json

    @classmethod
    def from_json(cls, doc: Document) -> CapacityEstimate:
        comps = doc.get("components")
        return cls(
            _str(doc.get("model")),
            _str(doc.get("gpu")),
            _str(doc.get("engine")),
            _str(doc.get("engine_version")),
            tuple(PlannedComponent.from_json(_doc(c)) for c in comps) if isinstance(comps, list) else (),
            as_int(doc.get("kv_cache_tokens")),
            as_int(doc.get("block_size")),
            as_int(doc.get("max_model_len")),
            _doc(doc.get("settings")),
            doc,
        )


@dataclass(frozen=True)
class PlanFactsRecord:
    """The facts the plan was made from: the target's model, engine, card and settings."""

    model: str | None = None
    engine: str | None = None
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    engine_version: str | None = None
    settings: Document = field(default_factory=dict)
    document: Document | None = None  # as stored (None: made here, not read)

    def to_json(self) -> dict[str, object]:
        """The stored form (the key order the runner has always written)."""
        if self.document is not None:
            return dict(self.document)
        return {
            "model": self.model,
            "engine": self.engine,
            "gpu": self.gpu,
            "gpu_memory_gib": self.gpu_memory_gib,
            "engine_version": self.engine_version,
            "settings": dict(self.settings),
        }

    @classmethod
    def from_json(cls, doc: Document) -> PlanFactsRecord:
        return cls(
            _str(doc.get("model")),
            _str(doc.get("engine")),
            _str(doc.get("gpu")),
            as_float(doc.get("gpu_memory_gib")),
            _str(doc.get("engine_version")),
            _doc(doc.get("settings")),
            doc,
        )


@dataclass(frozen=True)
class CapacityPlanRecord:
    """A `capacity_plan` event's data: facts and estimate (either may be missing in an old row)."""

    facts: PlanFactsRecord | None
    estimate: CapacityEstimate | None


def capacity_plan_record(ev: HasData) -> CapacityPlanRecord:
    data = capacity_plan_data(ev)
    facts, est = _doc(data.get("facts")), _doc(data.get("estimate"))
    return CapacityPlanRecord(
        PlanFactsRecord.from_json(facts) if facts else None,
        CapacityEstimate.from_json(est) if est else None,
    )


@dataclass(frozen=True)
class StartupObservation:
    """What the target's start-up log said about memory (a logs.Observation as stored)."""

    engine: str | None
    weights_bytes: int | None
    kv_cache_bytes: int | None
    kv_cache_tokens: int | None
    byte_figures: Mapping[str, int]  # every `*_bytes` figure it holds, by its plan-JSON name
    settings: Document  # the settings the engine printed
    extra: Document  # engine-specific figures (kv_bytes_per_token, host_weights_bytes, ...)
    document: Document  # the whole stored observation

    def extra_number(self, name: str) -> float | None:
        return as_float(self.extra.get(name))

    @classmethod
    def from_json(cls, doc: Document) -> StartupObservation:
        return cls(
            _str(doc.get("engine")),
            as_int(doc.get("weights_bytes")),
            as_int(doc.get("kv_cache_bytes")),
            as_int(doc.get("kv_cache_tokens")),
            {k: v for k, v in doc.items() if k.endswith("_bytes") and isinstance(v, int)},
            _doc(doc.get("settings")),
            _doc(doc.get("extra")),
            doc,
        )


@dataclass(frozen=True)
class StartupMemoryRecord:
    """A `startup_memory` event's data: where the figures come from, and the observation."""

    source: str | None
    observation: StartupObservation | None


def startup_memory_record(ev: HasData) -> StartupMemoryRecord:
    data = startup_memory_data(ev)
    obs = _doc(data.get("observation"))
    return StartupMemoryRecord(_str(data.get("source")), StartupObservation.from_json(obs) if obs else None)


class HasMessage(HasData, Protocol):
    """An `Event` or an `EventRecord`, with its message."""

    @property
    def message(self) -> str: ...


def is_capacity_plan_note(ev: HasMessage) -> bool:
    """A note (or, in a drill stored before the notes were one kind, a warning) about the capacity
    plan: by its `by` field; a row stored before that field, by its text."""
    if ev.kind == EventKind.NOTE and note_data(ev).get("by") == CAPACITY_PLAN_NOTE:
        return True
    old_kinds = (EventKind.NOTE, EventKind.WARNING)
    return ev.kind in old_kinds and "by" not in ev.data and ev.message.startswith(_OLD_NOTE_PREFIX)
