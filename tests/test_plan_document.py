"""The one plan document (vramlab.plandoc): `kind:` picks the model and the command, one vocabulary
for stops, retries, ramps and metrics endpoints, the older names still load with one note each, and
a run stored under the old names reads the same in the report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from vramlab.drill import plan as drill_plan
from vramlab.errors import ConfigError
from vramlab.experiment import plan as experiment_plan
from vramlab.records import EventRecord, RequestRecord, RunRecord

ROOT = Path(__file__).resolve().parents[1]
PLANS = {
    "concurrency-ramp": "experiment",
    "demo": "experiment",
    "memory-concurrency": "experiment",
    "memory-context": "experiment",
    "oom-drill": "drill",
    "cotenant-drill": "drill",
    "colocation-drill": "colocation",
    "trace-replay": "experiment",
}
LOADERS: dict[str, Callable[[Path], experiment_plan.Plan | drill_plan.DrillPlan]] = {
    "experiment": experiment_plan.load_plan,
    "drill": drill_plan.load_plan,
    "colocation": drill_plan.load_plan,
}


def test_every_shipped_plan_names_its_kind_and_loads_without_a_note():
    shipped = {p.stem for p in (ROOT / "examples").glob("*.yaml")} - {"fleet", "models"}  # pack's inputs
    assert shipped == set(PLANS)
    for name, kind in PLANS.items():
        for folder in (ROOT / "examples", ROOT / "src" / "vramlab" / "data" / "examples"):
            path = folder / f"{name}.yaml"
            assert yaml.safe_load(path.read_text())["kind"] == kind, path
            plan = LOADERS[kind](path)
            assert plan.kind == kind and plan.old_name_notes() == [], (path, plan.old_name_notes())


OLD_DRILL = """
name: old-drill
target:
  kind: sim
  environment: test
  metrics_path: /engine/metrics
  sim: {model: qwen2.5-0.5b-instruct, gpu: l4, speed: 200}
load: {concurrency: 2}
ramp: {knob: context, start: 256, ceiling: 1024}
stop: {error_rate: 0.4, p95_ms: 900}
clients: {policy: immediate, max_attempts: 5}
"""


def test_an_old_drill_document_loads_with_one_note_per_old_name(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(OLD_DRILL)
    plan = drill_plan.load_plan(path)
    assert plan.old_name_notes() == [
        f"{path}: kind: (missing) -> kind: drill; a plan names its kind now",
        f"{path}: stop -> stop_conditions (the old name still loads; rename it)",
        f"{path}: clients -> load.retry (the old name still loads; rename it)",
        f"{path}: target.metrics_path -> target.metrics_url (the old name still loads; rename it)",
    ]
    assert plan.kind == "drill"
    # the values moved, and the drill's own defaults fill what the old stop: left out
    assert (plan.stop_conditions.error_rate, plan.stop_conditions.p95_ms, plan.stop_conditions.window_s) == (
        0.4,
        900,
        3,
    )
    assert (plan.load.retry.policy, plan.load.retry.max_attempts, plan.load.concurrency) == (
        "immediate",
        5,
        2,
    )
    assert plan.target.metrics_endpoint("http://127.0.0.1:9") == "http://127.0.0.1:9/engine/metrics"
    assert plan.warnings()[:4] == plan.old_name_notes()  # stored with the drill as warnings
    # the document the notes came from is not edited, and the plan dumps in the new names only
    dumped = plan.model_dump(mode="json")
    assert {"stop", "clients"}.isdisjoint(dumped) and dumped["load"]["retry"]["policy"] == "immediate"
    assert drill_plan.parse_plan(dumped).old_name_notes() == []


def test_an_old_experiment_document_loads_with_its_notes(tmp_path):
    text = (ROOT / "examples" / "concurrency-ramp.yaml").read_text()
    old = text.replace("kind: experiment\n", "").replace("ceiling: 16}", "max: 16}")
    path = tmp_path / "old.yaml"
    path.write_text(old)
    plan = experiment_plan.load_plan(path)
    assert plan.old_name_notes() == [
        f"{path}: kind: (missing) -> kind: experiment; a plan names its kind now",
        f"{path}: change.ramp.max -> change.ramp.ceiling (the old name still loads; rename it)",
    ]
    assert (
        plan.change.values() == [2, 4, 8, 16]
        and plan.change.ramp is not None
        and plan.change.ramp.ceiling == 16
    )
    assert (
        plan.warnings()[:2] == plan.old_name_notes()
    )  # the runner stores plan.warnings() as the run's notes


def test_a_field_given_by_both_names_and_a_foreign_kind_are_one_line(tmp_path):
    both = OLD_DRILL.replace("load: {concurrency: 2}", "load: {concurrency: 2, retry: {policy: none}}")
    with pytest.raises(ConfigError) as err:
        drill_plan.parse_plan(yaml.safe_load(both), "both.yaml")
    assert str(err.value) == (
        "both.yaml: load.retry: given twice: as load.retry and by its old name clients; keep load.retry"
    )
    with pytest.raises(ConfigError, match=r"^plan.yaml:\d+: kind: unknown kind 'chaos'"):
        experiment_plan.parse_plan("kind: chaos\nname: x\n")
    with pytest.raises(ConfigError, match=r"^plan.yaml:1: kind: unknown kind \[1\]"):
        experiment_plan.parse_plan("kind: [1]\nname: x\n")
    doc = yaml.safe_load((ROOT / "examples" / "oom-drill.yaml").read_text())
    doc["kind"] = "colocation"  # colocation without a colocation: section
    with pytest.raises(
        ConfigError,
        match="^x.yaml: kind: colocation, but a drill with a colocation: section is "
        "kind: colocation and one without is kind: drill$",
    ):
        drill_plan.parse_plan(doc, "x.yaml")


@pytest.mark.parametrize(
    ("command", "example", "says"),
    [
        ("run", "oom-drill.yaml", "this is a drill plan; run it with `vramlab drill {path}`"),
        ("run", "colocation-drill.yaml", "this is a colocation plan; run it with `vramlab drill {path}`"),
        ("drill", "concurrency-ramp.yaml", "this is an experiment plan; run it with `vramlab run {path}`"),
    ],
)
def test_a_plan_of_another_kind_is_refused_with_the_command_to_use(command, example, says, capsys, tmp_path):
    from vramlab.cli.main import main

    path = ROOT / "examples" / example
    code = main([command, str(path), "--db", str(tmp_path / "v.db")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].endswith(f"kind: {says.format(path=path)}"), err[0]
    assert not (tmp_path / "v.db").exists()  # refused before the store is touched


def test_one_sim_settings_model_for_run_drill_and_colocation():
    from vramlab.drill.colocation import ColocatedEngine
    from vramlab.drill.target import TargetSpec
    from vramlab.experiment.plan import Target
    from vramlab.plandoc import SimSettings

    run = Target.model_validate({"kind": "sim", "model": "qwen2.5-0.5b-instruct", "sim": {"gpu": "l4"}})
    drill = TargetSpec.model_validate({"kind": "sim", "sim": {"gpu": "l4"}})
    engine = ColocatedEngine.model_validate({"name": "e", "start_order": 2, "sim": {"gpu": "l4"}})
    for sim in (run.sim, drill.sim, engine.sim):
        assert type(sim) is SimSettings
    # one set of defaults; an experiment's sim serves the model its requests name
    assert run.sim is not None and drill.sim is not None
    # ... and keeps the pace runs always had where the plan leaves speed out (the model's default is a drill's)
    assert run.sim.argv() == [
        "--model",
        "qwen2.5-0.5b-instruct",
        "--gpu",
        "l4",
        "--engine",
        "vllm",
        "--speed",
        "20",
        "--seed",
        "0",
    ]
    assert SimSettings().speed == 50 and engine.sim.speed == 50
    assert drill.sim.argv() == [
        "--model",
        "llama-3.1-8b-instruct",
        "--gpu",
        "l4",
        "--engine",
        "vllm",
        "--speed",
        "50",
        "--seed",
        "0",
    ]


def test_a_metrics_url_is_a_url_or_a_path_on_the_target():
    from vramlab.experiment.plan import Target

    root = "http://10.0.0.5:8000"
    assert Target(model="m", base_url=root + "/v1").metrics_endpoint(root) == root + "/metrics"
    assert (
        Target(model="m", base_url=root, metrics_url="/x/metrics").metrics_endpoint(root)
        == root + "/x/metrics"
    )
    other = "http://10.0.0.5:9400/metrics"
    assert Target(model="m", base_url=root, metrics_url=other).metrics_endpoint(root) == other
    with pytest.raises(ValueError, match="http:// or https:// URL"):
        Target(model="m", base_url=root, metrics_url="metrics")


# -- a run stored under the old names, in the report -------------------------------------------

RUN = "0ddba11a"


def _stored_drill(plan: dict) -> RunRecord:
    return RunRecord(
        run_id=RUN,
        kind="drill",
        name="old-drill",
        plan=plan,
        started_at=1_760_000_000.0,
        ended_at=1_760_000_030.0,
        status="completed",
        change={"variable": "context", "unit": "prompt tokens", "steps": [256.0, 512.0]},
    )


def _context(plan: dict):
    from vramlab.report.sections import ReportContext

    reqs = [
        RequestRecord(
            run_id=RUN,
            round=0,
            phase="baseline",
            request_id=f"u0:{i}",
            sent_s=i * 0.2,
            end_s=i * 0.2 + 0.1,
            e2e_ms=100.0,
            status_code=200,
        )
        for i in range(10)
    ]
    events = [
        EventRecord(
            run_id=RUN, t_s=0.0, kind="phase_start", round=0, message="baseline", data={"phase": "baseline"}
        ),
        EventRecord(
            run_id=RUN, t_s=2.0, kind="step", round=0, message="step", data={"step": 0, "value": 256}
        ),
    ]
    return ReportContext.build(_stored_drill(plan), reqs, [], events)


def test_a_drill_stored_under_the_old_names_reads_through_the_plan_model():
    from vramlab.plandoc import RecoverySpec, Retry
    from vramlab.report import render
    from vramlab.report.blocks import Table
    from vramlab.report.incident import s_storm
    from vramlab.report.incident_base import incident_of, plan_section

    old = yaml.safe_load(OLD_DRILL)  # as a run from before `kind:` stored it: stop:, clients:
    old["recovery"] = {"p95_tolerance": 2.0}
    ctx = _context(old)
    assert ctx.plan["kind"] == "drill" and ctx.plan["load"]["retry"]["policy"] == "immediate"
    assert "clients" not in ctx.plan and ctx.run.plan["clients"] == {"policy": "immediate", "max_attempts": 5}
    assert plan_section(ctx, Retry, "load", "retry").max_attempts == 5
    assert plan_section(ctx, RecoverySpec, "recovery").p95_tolerance == 2.0
    assert (
        plan_section(ctx, RecoverySpec, "recovery").limit_s == RecoverySpec().limit_s
    )  # the model's default
    storm = s_storm(ctx)[0]
    assert isinstance(storm, Table) and ["client retry policy", "immediate"] in storm.rows
    # the new names read the same; a section that no longer validates reads as the model's defaults
    new = _context(
        {"kind": "drill", "load": {"retry": {"policy": "exponential"}}, "recovery": {"limit_s": "soon"}}
    )
    storm = s_storm(new)[0]
    assert isinstance(storm, Table) and ["client retry policy", "exponential"] in storm.rows
    assert plan_section(new, RecoverySpec, "recovery") == RecoverySpec()
    # the incident is computed once per report context, not kept in a cache of the module
    assert incident_of(ctx) is incident_of(ctx) and incident_of(new) is not incident_of(ctx)
    text = render(ctx, "md")
    assert "immediate" in text and "stop_conditions" in text


def test_a_run_of_an_old_plan_stores_its_notes_with_the_run(tmp_path):
    """The runner stores plan.warnings() as the run's notes: the old names travel with the run."""
    import asyncio

    from vramlab.experiment.kind import ExperimentKind, RunOptions
    from vramlab.load.stub import StubBehaviour, StubServer
    from vramlab.run.events import EventHook
    from vramlab.run.recorder import StoreRecorder
    from vramlab.run.runner import Runner
    from vramlab.store import open_store

    store = open_store(str(tmp_path / "v.db"))

    async def go(url: str) -> str:
        plan = experiment_plan.parse_plan(
            f"""
name: old-run
target: {{base_url: "{url}", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 3, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, ramp: {{start: 1, factor: 2, max: 2}}}}
phases: {{duration_s: 0.2, drain_s: 0.2}}
rounds: 1
samplers: {{sources: [host], interval_s: 0.05}}
""",
            "old-run.yaml",
        )
        hook = EventHook()
        hook.add(StoreRecorder(store))
        return (await Runner(ExperimentKind(plan, RunOptions()), hook).run()).run_id

    async def main() -> str:
        async with StubServer(StubBehaviour(ttft_s=0.002)) as srv:
            return await go(srv.url)

    run = store.get_run(asyncio.run(main()))
    assert run.status == "completed" and run.change["steps"] == [1, 2]
    assert (
        "old-run.yaml: change.ramp.max -> change.ramp.ceiling (the old name still loads; rename it)"
        in run.notes
    )
    assert (
        run.plan["kind"] == "experiment" and run.plan["change"]["ramp"]["ceiling"] == 2
    )  # stored in the new names


def test_a_drill_of_too_few_rounds_stores_its_warning_with_the_field_a_report_reads(tmp_path):
    import asyncio

    import yaml

    from vramlab.drill.kind import DrillKind
    from vramlab.records.events import warning_data
    from vramlab.records.memory import MemoryStore
    from vramlab.run.events import Event, EventHook
    from vramlab.run.runner import Runner

    doc = yaml.safe_load((ROOT / "examples" / "oom-drill.yaml").read_text())
    doc["target"]["sim"]["device"] = str(tmp_path / "gpu0.ledger")
    doc["rounds"] = 1
    kind = DrillKind(drill_plan.parse_plan(doc), MemoryStore(), workdir=str(tmp_path))
    hook, seen = EventHook(), list[Event]()
    hook.add(seen.append)
    Runner(kind, hook)  # attaches the kind: its events go to the hook
    asyncio.run(kind.started())  # the plan's notes, as warnings, before the target is touched
    fields = {e.message.split(";")[0]: warning_data(e).get("plan_field") for e in seen}
    assert fields == {"rounds: 1 is fewer than 3": "rounds"}, fields
