"""One runner runs experiments and drills: both kinds go through the same rounds and step loop of
run/runner.py's Runner, which stamps where the run is; the kinds have no loop of their own, and the
run package names no kind (an import contract keeps it so)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest

from vramlab.experiment.kind import ExperimentKind, RunOptions
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.records import RunRecord
from vramlab.records import emit as E
from vramlab.run.capacity_plan import PlanFacts
from vramlab.run.events import Event, EventHook
from vramlab.run.rollback import RollbackResult
from vramlab.run.runner import Runner
from vramlab.run.steps import FixedSteps, StepOutcome, StepStrategy
from vramlab.store import open_store

SRC = Path(__file__).resolve().parents[1] / "src" / "vramlab"
DRILL = SRC / "drill"
_SHAPE = {"run_start", "phase_start", "step", "run_end"}


def _spy_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, float]]:
    """Every step the one Runner runs, with the kind of run it ran it for."""
    seen: list[tuple[str, int, float]] = []
    real = Runner._step

    async def step(self: Runner, rnd: int, step: int, value: float, last: float | None) -> bool:
        seen.append((type(self.kind).__name__, step, value))
        return await real(self, rnd, step, value, last)

    monkeypatch.setattr(Runner, "_step", step)
    return seen


def test_an_experiment_and_a_drill_run_through_the_one_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vramlab.drill.kind import DrillKind
    from vramlab.drill.plan import parse_plan as parse_drill
    from vramlab.drill.start import run_drill_kind
    from vramlab.experiment.plan import parse_plan

    seen = _spy_steps(monkeypatch)
    store = open_store(str(tmp_path / "s.db"))
    exp_events: list[Event] = []
    drill_events: list[Event] = []

    async def go() -> tuple[Any, Any, str]:
        async with StubServer(StubBehaviour(ttft_s=0.005)) as srv:
            plan = parse_plan(f"""
name: one
target: {{base_url: "{srv.url}", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 2, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: [2]}}
phases: {{duration_s: 0.3, drain_s: 0.5}}
rounds: 1
""")
            hook = EventHook()
            hook.add(exp_events.append)
            exp = await Runner(
                ExperimentKind(plan, RunOptions(samplers=[], capture_environment=False)), hook
            ).run()
            doc = {
                "name": "one-drill",
                "rounds": 1,
                "baseline_s": 0.3,
                "target": {"kind": "command", "environment": "test", "base_url": srv.url, "model": "m"},
                "load": {"concurrency": 1, "prompt_tokens": 8, "max_tokens": 2},
                "ramp": {"knob": "concurrency", "start": 1, "factor": 2, "ceiling": 2, "step_s": 0.3},
            }
            drill = DrillKind(parse_drill(doc), store, workdir=str(tmp_path / "w"))
            out = await asyncio.wait_for(run_drill_kind(drill, store, subscribers=[drill_events.append]), 60)
            return exp, out, drill.run_id

    exp, drill, rid = asyncio.run(go())
    assert exp.status == "completed" and drill.status == "completed", (exp, drill)
    # both kinds' steps went through the runner's one step loop, numbered by it from 1
    assert seen == [("ExperimentKind", 1, 2.0), ("DrillKind", 1, 1.0), ("DrillKind", 2, 2.0)]
    for events, kind in ((exp_events, "experiment"), (drill_events, "drill")):
        shape = [e.kind for e in events if e.kind in _SHAPE]
        assert shape[0] == "run_start" and shape[-1] == "run_end", shape
        assert shape.count("run_start") == 1 and shape.count("run_end") == 1, shape
        assert isinstance(events[0].payload, RunRecord) and events[0].payload.kind == kind
        assert events[-1].data["status"] == "completed"
        first_baseline = next(
            i for i, e in enumerate(events) if e.kind == "phase_start" and e.phase == "baseline"
        )
        first_step = next(
            i
            for i, e in enumerate(events)
            if e.kind == "step" or (e.kind == "phase_start" and e.phase == "treatment")
        )
        assert first_baseline < first_step
    assert [(e.round, e.phase, e.step) for e in drill_events if e.kind == "step"] == [
        (0, "ramp", 1),
        (0, "ramp", 2),
    ]
    for events in (exp_events, drill_events):  # the runner's positions, the same for both kinds
        starts = {(e.phase, e.step) for e in events if e.kind == "phase_start"}
        assert ("baseline", 0) in starts, starts
        assert {(e.round, e.phase, e.step) for e in events if e.kind == "run_end"} == {(None, None, None)}
    assert [e.kind for e in store.events(rid)][-1] == "run_end"


class _Scripted:
    """A kind of run whose steps fail from *fail_at* on, recording what the runner asked of it."""

    rounds = range(1, 3)
    step_phase = "step"
    wall_clock_s = 60.0

    def __init__(
        self,
        values: list[float],
        fail_at: float | None = None,
        hang: bool = False,
        baseline_error: Exception | None = None,
    ) -> None:
        self.run_id = "5c21e7ed"
        self.values, self.fail_at, self.hang = values, fail_at, hang
        self.baseline_error = baseline_error
        self.calls: list[tuple[Any, ...]] = []
        self.value = self.windowing = 0.0
        self.windows_cancelled = 0

    def attach(self, run: Runner) -> None:
        self.run = run

    async def record(self) -> tuple[str, RunRecord]:
        return "start", RunRecord(
            run_id=self.run_id,
            kind="experiment",
            name="s",
            plan={},
            plan_hash="h",
            fixed={},
            target={},
            change={},
            started_at=0.0,
        )

    async def started(self) -> None:
        self.calls.append(("started",))

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        stack.callback(self.calls.append, ("closed",))

    def capacity_facts(self) -> PlanFacts:
        return PlanFacts("m", "vllm")

    @contextlib.asynccontextmanager
    async def round(self, rnd: int) -> Any:
        self.calls.append(("round", rnd))
        try:
            yield
        finally:
            self.calls.append(("round_end", rnd))

    async def baseline(self, rnd: int) -> None:
        self.run.emit(E.PHASE_START())
        if self.baseline_error is not None:
            raise self.baseline_error

    def steps(self) -> StepStrategy:
        return FixedSteps(self.values)

    def begin_step(self, step: int, value: float) -> None:
        self.windowing = 0.0
        self.run.emit(E.STEP("", {"value": value}))

    async def apply(self, value: float) -> bool:
        self.value = value
        return True

    async def window(self, rnd: int, step: int, value: float) -> None:
        self.windowing = value
        try:
            await asyncio.sleep(3600 if self.hang else 0.15)
        except asyncio.CancelledError:
            self.windows_cancelled += 1
            raise

    def step_failed(self) -> bool:
        return self.fail_at is not None and self.windowing >= self.fail_at  # seen once its window runs

    def on_step_failure(self, step: int, value: float, last: float | None, window: Any) -> bool:
        self.calls.append(("failed", step, value, last, window is not None))
        return False

    def end_step(self, step: int, value: float) -> StepOutcome:
        return StepOutcome(step, value, 1, 0, None, None)

    async def steps_held(self, rnd: int) -> None:
        self.calls.append(("held", rnd))

    async def recovery(self, rnd: int, failed: bool) -> None:
        self.run.emit(E.PHASE_START())
        self.calls.append(("after", rnd, failed))

    def tick(self) -> None:
        pass

    def after_rounds(self) -> None:
        self.calls.append(("after_rounds",))

    async def rollback(self, status: str, reason: str | None) -> list[RollbackResult]:
        self.calls.append(("rollback", status, reason))
        self.run.emit(E.ROLLBACK())
        return []

    def run_end(self, status: str, reason: str | None) -> E.Draft:
        return E.RUN_END(status, {"status": status, "stop_reason": reason})

    def totals(self) -> tuple[int, int]:
        return 0, 0


def test_a_failing_step_ends_the_steps_and_the_window_is_cancelled_within_the_polling_interval() -> None:
    kind = _Scripted([1.0, 2.0, 3.0], fail_at=2.0)
    events: list[Event] = []
    hook = EventHook()
    hook.add(events.append)
    res = asyncio.run(Runner(kind, hook).run())
    assert res.status == "completed"
    assert ("failed", 2, 2.0, 1.0, True) in kind.calls  # step 2 failed while its window ran; step 1 completed
    assert [c for c in kind.calls if c[0] in ("after", "held", "rollback", "after_rounds")] == [
        ("after", 1, True),
        ("after", 2, True),
        ("after_rounds",),
        ("rollback", "completed", None),
    ]
    # the failed step's window (kept by no one) ends with the step, a polling interval into its 0.15 s
    assert kind.windows_cancelled == 2
    assert [e.data["value"] for e in events if e.kind == "step"] == [1.0, 2.0, 1.0, 2.0]  # 3.0 never ran
    assert events[-1].kind == "run_end" and events[0].kind == "run_start"


def test_an_error_is_recorded_on_the_run_rolled_back_and_kept_on_the_result() -> None:
    kind = _Scripted([1.0], baseline_error=RuntimeError("boom"))
    events: list[Event] = []
    hook = EventHook()
    hook.add(events.append)
    res = asyncio.run(Runner(kind, hook).run())  # never raised through: one ending for every kind
    assert (
        res.status == "failed" and res.reason == "RuntimeError: boom" and isinstance(res.error, RuntimeError)
    )
    assert res.exit_code == 70  # not a VramlabError: a bug in vramlab
    assert ("rollback", "failed", "RuntimeError: boom") in kind.calls and ("closed",) in kind.calls
    assert [e.kind for e in events][-3:] == ["error", "rollback", "run_end"]
    assert events[-1].data["status"] == "failed"


def test_the_runner_stamps_where_the_run_is() -> None:
    kind = _Scripted([1.0, 2.0])
    events: list[Event] = []
    hook = EventHook()
    hook.add(events.append)
    asyncio.run(Runner(kind, hook).run())
    where = [(e.kind, e.round, e.phase, e.step) for e in events if e.kind != "run_start"]
    assert where[:5] == [
        ("phase_start", 1, "baseline", 0),
        ("step", 1, "step", 1),
        ("step", 1, "step", 2),
        ("phase_start", 1, "recovery", 0),
        ("phase_start", 2, "baseline", 0),
    ]
    assert where[-2:] == [("rollback", None, "rollback", None), ("run_end", None, None, None)]
    assert ("held", 1) in kind.calls  # no step failed: the kind's steps_held, at the last step


def test_a_store_failure_from_another_thread_fails_the_run_and_rolls_back() -> None:
    kind = _Scripted([1.0], hang=True)

    async def go() -> Any:
        runner = Runner(kind)
        task = asyncio.ensure_future(runner.run())
        await asyncio.sleep(0.3)
        threading.Thread(target=runner.abort_soon, args=("the store refused rows",)).start()
        return await asyncio.wait_for(task, 10)

    res = asyncio.run(go())
    assert res.status == "failed" and res.reason == "the store refused rows" and res.exit_code == 1
    assert kind.windows_cancelled == 1 and ("rollback", "failed", "the store refused rows") in kind.calls


def test_a_halt_stops_at_the_next_boundary_without_after_rounds() -> None:
    kind = _Scripted([1.0, 2.0])
    runner = Runner(kind)
    real = kind.end_step

    def end_step(step: int, value: float) -> StepOutcome:
        runner.halt("enough")
        return real(step, value)

    kind.end_step = end_step  # type: ignore[method-assign]
    res = asyncio.run(runner.run())
    assert res.status == "stopped" and res.reason == "enough" and res.exit_code == 3
    assert not [c for c in kind.calls if c[0] in ("after", "after_rounds")]
    assert ("round_end", 1) in kind.calls and ("round", 2) not in kind.calls


def _loops(tree: ast.AST) -> list[ast.For | ast.AsyncFor | ast.While]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))]


def test_the_drill_package_has_no_run_loop_of_its_own() -> None:
    """No rounds loop, no step loop, no run_start/run_end and no emit of its own in drill/: those are the runner's."""
    found = []
    for path in sorted(DRILL.glob("*.py")):
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
        for loop in _loops(tree):
            text = ast.get_source_segment(
                src, loop.iter if isinstance(loop, (ast.For, ast.AsyncFor)) else loop.test
            )
            body = ast.unparse(loop)
            if "rounds" in (text or "") or ".next(" in body or ".failure()" in body:
                found.append(f"{path.name}:{loop.lineno}: {text}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "emit":
                found.append(f"{path.name}:{node.lineno}: def emit")
            if isinstance(node, ast.Constant) and node.value in ("run_start", "run_end"):
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_the_run_package_names_no_kind_and_no_kind_has_a_runner_class() -> None:
    """run/ imports neither kind (the contract "run" says so too); the one Runner is the only runner."""
    for path in sorted((SRC / "run").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in names if m.startswith(("vramlab.experiment", "vramlab.drill"))], path
    runners = [
        f"{p.relative_to(SRC)}:{n.name}"
        for p in SRC.rglob("*.py")
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(n, ast.ClassDef) and n.name.endswith(("Runner", "Session"))
    ]
    assert runners == ["run/runner.py:Runner"], runners
