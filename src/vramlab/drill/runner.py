"""`DrillRunner`: a drill run by the one runner (experiment/runner.py's ``Runner``) with the
drill's parts (kind.py), its rows into the store as they happen; ``DrillResult`` is what it says.

No loop lives here: the rounds, the step loop, the events, the store-failure abort, Ctrl-C and
the rollback are the runner's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vramlab.drill.kind import DrillKind
from vramlab.drill.plan import DrillPlan
from vramlab.drill.target import Target
from vramlab.experiment.events import EventHook
from vramlab.experiment.recorder import StoreRecorder
from vramlab.experiment.runner import Runner
from vramlab.records.store import Store


@dataclass
class DrillResult:
    run_id: str
    status: str
    stop_reason: str | None
    failed_rounds: list[int] = field(default_factory=list)
    workdir: str = ""
    unrecovered_rounds: list[int] = field(
        default_factory=list
    )  # failed and not serving again within the limit


class DrillRunner:
    """A drill plan's run: ``await DrillRunner(plan, store).run()``. Ctrl-C (a cancellation) and an
    error go on to the caller after the rollback and run_end; a store that refuses rows fails the run."""

    def __init__(
        self,
        plan: DrillPlan,
        store: Store,
        *,
        override_env: bool = False,
        workdir: str | None = None,
        run_id: str | None = None,
        hook: EventHook | None = None,
    ) -> None:
        self.plan = plan
        self.store = store
        self.kind = DrillKind(plan, store, override_env=override_env, workdir=workdir, run_id=run_id)
        self.runner = Runner(self.kind, hook)
        self.hook = self.runner.hook
        self.run_id = self.kind.run_id
        self.recorder = StoreRecorder(store, flush_s=0.25)  # its accounting() says what was stored

    @property
    def target(self) -> Target:
        return self.kind.target

    @property
    def workdir(self) -> Path:
        return self.kind.workdir

    @property
    def load_time_s(self) -> float | None:
        """The first start's measured load time (start -> health 200), when the drill started the target."""
        return self.kind.lifecycle.load_time_s

    def now(self) -> float:
        return self.runner.now()

    async def run(self) -> DrillResult:
        self.hook.add(self.recorder)
        self.recorder.on_failure = (
            self.runner.abort_soon
        )  # the writer thread gave up: stop the load, roll back
        res = await self.runner.run()
        return DrillResult(
            self.run_id,
            res.status,
            res.reason,
            list(self.kind.failed_rounds),
            str(self.workdir),
            list(self.kind.unrecovered_rounds),
        )


__all__ = ["DrillResult", "DrillRunner"]
