"""Start a drill plan, as `vramlab drill` and the demo do: the drill's parts (kind.py) in the one
session (run/session.py: store writer, signals, capacity plan, exit policy). No loop lives here:
the rounds, the step loop, the events, the store-failure abort, Ctrl-C and the rollback are the
runner's (run/runner.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vramlab.drill.kind import DrillKind
from vramlab.drill.plan import DrillPlan
from vramlab.records.store import Store
from vramlab.run.events import Handler
from vramlab.run.session import Card, SessionResult, run_recorded, run_session

FLUSH_S = 0.25  # a drill's rows go out four times a second: it is seconds long, its timeline read live


@dataclass(frozen=True)
class DrillOutcome:
    """What a drill's session got, and what the drill saw live about its rounds."""

    session: SessionResult
    failed_rounds: list[int]
    unrecovered_rounds: list[int]  # failed and not serving again within the recovery limit
    workdir: str

    @classmethod
    def of(cls, kind: DrillKind, session: SessionResult) -> DrillOutcome:
        return cls(session, list(kind.failed_rounds), list(kind.unrecovered_rounds), str(kind.workdir))

    @property
    def run_id(self) -> str:
        return self.session.result.run_id

    @property
    def status(self) -> str:
        return self.session.result.status

    @property
    def stop_reason(self) -> str | None:
        return self.session.result.reason


def run_drill(
    plan: DrillPlan,
    store: Store,
    *,
    override_env: bool = False,
    workdir: str | None = None,
    card: Card | None = None,
    subscribers: Sequence[Handler] = (),
    on_run: Callable[[str], None] | None = None,
) -> DrillOutcome:
    """Run *plan* into *store* (the caller opens and closes it). The environment check refuses a
    target not declared `environment: test` (without *override_env*) before anything is touched;
    *on_run* is told the run id before the drill starts."""
    kind = DrillKind(plan, store, override_env=override_env, workdir=workdir)
    if on_run is not None:
        on_run(kind.run_id)
    out = run_session(kind, store, subscribers=subscribers, card=card, flush_s=FLUSH_S)
    return DrillOutcome.of(kind, out)


async def run_drill_kind(
    kind: DrillKind, store: Store, *, subscribers: Sequence[Handler] = (), card: Card | None = None
) -> DrillOutcome:
    """The drill *kind* on the running event loop, recorded as ``run_drill`` records it (without
    the session's signals and watchdog: for a caller with a loop of its own, such as a test)."""
    return DrillOutcome.of(
        kind, await run_recorded(kind, store, subscribers=subscribers, card=card, flush_s=FLUSH_S)
    )


__all__ = ["DrillOutcome", "run_drill", "run_drill_kind"]
