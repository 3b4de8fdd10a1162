"""One small event type and a hook that subscribers attach to (locust's EventHook).

The runner emits; the terminal progress, the store writer and a drill's own logic subscribe.
The kinds are `vramlab.records.events.EventKind` (each member says when it is emitted and what its
data holds); a writer makes an event's draft with its kind's typed constructor (`vramlab.records.emit`,
checked by mypy) and the runner stamps it (`Runner.emit`). Timeline kinds are stored as EventRecord; the data
kinds (`DATA_KINDS`) are not timeline rows: ``request`` (payload: RequestRecord) and ``samples``
(payload: list[SampleRecord]). An Event of a kind that is not a member is refused: a bug (exit 70).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vramlab.records.emit import Payload
from vramlab.records.events import DATA_KINDS, EventKind, check_kind


@dataclass(frozen=True)
class Event:
    kind: EventKind | str  # a string is checked and turned into its member
    t_s: float  # seconds from the run's start
    round: int | None = None
    phase: str | None = None
    step: int | None = None
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    payload: Payload = (
        None  # RunRecord for run_start, RequestRecord for request, list[SampleRecord] for samples
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", check_kind(self.kind))  # ValueError on a kind not in EventKind


Handler = Callable[[Event], None]


class EventHook:
    """Subscribers are called in order. A subscriber that raises is detached and its error kept,
    so a broken progress display cannot end a run; the runner turns ``errors`` into notes. A
    *critical* subscriber (the store writer) raises through: a run that cannot be stored stops."""

    def __init__(self) -> None:
        self._handlers: list[Handler] = []
        self._critical: set[int] = set()
        self.errors: list[str] = []

    def add(self, handler: Handler, critical: bool = False) -> Handler:
        self._handlers.append(handler)
        if critical:
            self._critical.add(id(handler))
        return handler

    def remove(self, handler: Handler) -> None:
        if handler in self._handlers:
            self._handlers.remove(handler)

    def fire(self, event: Event) -> None:
        for h in list(self._handlers):
            try:
                h(event)
            except Exception as exc:
                if id(h) in self._critical:
                    raise
                self.remove(h)
                name = getattr(h, "__qualname__", None) or type(h).__name__
                self.errors.append(
                    f"event subscriber {name} failed and was detached: {type(exc).__name__}: {exc}"[:300]
                )


__all__ = ["DATA_KINDS", "Event", "EventHook", "EventKind", "Handler"]
