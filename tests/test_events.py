"""The event kinds are a typed enumeration (vramlab.records.events): every kind emitted anywhere in
src/ is a member, an Event of any other kind is refused (exit 70 in the CLI), each producer's data
keys are the ones its payload type declares, and the reports read kinds and data through them."""

from __future__ import annotations

import ast
import asyncio
import datetime as dt
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from vramlab.records import EventRecord, SampleRecord
from vramlab.records import emit as E
from vramlab.records.emit import PAYLOADS, Draft, Emit, payload_keys
from vramlab.records.events import DATA_KINDS, EventKind, check_kind, fault_data, step_data
from vramlab.run.events import Event, EventHook

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vramlab"
KINDS = {k.value for k in EventKind}


def _undeclared(kind: str, data: Mapping[str, Any]) -> set[str]:
    """Data keys the kind's payload type does not declare (constructing the Event checks the kind)."""
    ev = Event(kind, 0.0, data=dict(data))
    return set(data) - payload_keys(check_kind(ev.kind))


# -- the enumeration ---------------------------------------------------------------------------


def test_every_kind_is_documented_and_has_a_payload_type():
    assert len(KINDS) == len(EventKind) >= 40
    for k in EventKind:
        assert re.fullmatch(r"[a-z][a-z_]*", k.value), k
        assert len(k.doc) > 15 and k.doc == k.doc.strip(), k
        assert k in PAYLOADS and isinstance(payload_keys(k), frozenset)
        # a str enum: equal to its string, printed as it, hashed as it (old rows, dict keys)
        assert k == k.value and str(k) == f"{k}" == k.value and {k.value: 1}[k] == 1
    assert DATA_KINDS == {"request", "samples"}
    assert payload_keys(EventKind.FAULT) >= {"t0_s", "step", "value", "mode", "evidence", "signature"}
    assert payload_keys(EventKind.ALERT) >= {"name", "state", "for"}  # a keyword key, in the functional form


def test_an_event_of_an_unknown_kind_is_refused_and_a_known_one_is_its_member():
    with pytest.raises(ValueError, match=r"unknown event kind 'faults'.*EventKind"):
        Event("faults", 0.0)
    ev = Event("fault", 1.0, data={"t0_s": 0.5})
    assert ev.kind is EventKind.FAULT and fault_data(ev).get("t0_s") == 0.5
    with pytest.raises(ValueError, match="'fault' event read as step"):
        step_data(ev)  # a reader that picked the wrong row is a bug, not a None
    hook, seen = EventHook(), list[Event]()
    hook.add(seen.append)
    hook.fire(Event(EventKind.NOTE, 0.0, message="m"))
    assert seen[0].kind == "note"


def test_stored_kinds_stay_plain_strings_and_old_rows_still_read(tmp_path):
    from _synthetic_run import RUN_ID, insert
    from vramlab.report import load_context, render
    from vramlab.store import open_store

    with open_store(str(tmp_path / "s.db")) as store:
        insert(store)
        store.add_events(
            RUN_ID,
            [
                EventRecord(run_id=RUN_ID, t_s=1.0, kind=EventKind.NOTE, message="typed"),
                EventRecord(run_id=RUN_ID, t_s=2.0, kind="a_kind_from_an_older_version", message="kept"),
            ],
        )
        got = {e.message: e.kind for e in store.events(RUN_ID)}
        assert type(got["typed"]) is str and got["typed"] == "note"
        assert got["kept"] == "a_kind_from_an_older_version"  # reading never refuses a stored row
        md = render(load_context(store, RUN_ID), "md")
    assert "a_kind_from_an_older_version" in md and "typed" in md


# -- every kind emitted in src/ is a member ------------------------------------------------------


# the constructors of the kinds that carry a record (records/emit.py), by name
_RECORD_DRAFTS = {"run_start": "run_start", "request": "request", "samples": "samples"}


def _draft_kind(call: ast.Call) -> str | None:
    """The kind a writer's `E.X(...)` draft names (records/emit.py), or None for another call."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "E"):
        return None
    made = getattr(E, f.attr, None)
    return made.kind.value if isinstance(made, Emit) else _RECORD_DRAFTS.get(f.attr)


def _kind_nodes(call: ast.Call) -> list[ast.expr]:
    """The kind argument of an `Event(...)` or `EventRecord(kind=...)` made directly."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    out = []
    if name == "Event" and call.args:
        out.append(call.args[0])
    if name in ("Event", "EventRecord"):
        out += [kw.value for kw in call.keywords if kw.arg == "kind"]
    return out


def _emission_sites() -> list[tuple[str, int, str | None]]:
    """Every place in src/ that makes an event: (file, line, the kind it names; None for a variable)."""
    sites: list[tuple[str, int, str | None]] = []
    for p in sorted(SRC.rglob("*.py")):
        where = p.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Call):
                continue
            if (kind := _draft_kind(node)) is not None:
                sites.append((where, node.lineno, kind))
            for n in _kind_nodes(node):
                for leaf in [n.body, n.orelse] if isinstance(n, ast.IfExp) else [n]:
                    sites.append((where, leaf.lineno, _named_kind(leaf)))
    return sites


def _named_kind(leaf: ast.expr) -> str | None:
    """The kind a literal or an `EventKind.X` / `K.X` names; None for a variable (checked at run time)."""
    if isinstance(leaf, ast.Constant):
        return str(leaf.value)
    if (
        isinstance(leaf, ast.Attribute)
        and isinstance(leaf.value, ast.Name)
        and leaf.value.id in ("EventKind", "K")
    ):
        return EventKind[leaf.attr].value
    return None


def test_every_kind_literal_passed_as_an_event_kind_in_src_is_a_member():
    named = {(where, line): kind for where, line, kind in _emission_sites()}
    unknown = {site: k for site, k in named.items() if k is not None and k not in KINDS}
    assert not unknown, f"event kinds that are not EventKind members: {unknown}"
    # the scan sees the emitters it must: the drill's, the experiment runner's, the samplers' drafts
    files = {where for where, _ in named}
    assert {
        "drill/kind.py",
        "run/runner.py",
        "experiment/kind.py",
        "drill/recovery.py",
        "drill/lifecycle.py",
        "run/capacity_plan.py",
        "observe/ollama.py",
        "cli/note.py",
    } <= files
    from vramlab.drill.watch import FINDING_EVENTS

    emitted = {k for k in named.values() if k is not None} | {e.kind.value for e in FINDING_EVENTS.values()}
    # and no member is dead: every kind has a producer somewhere in src/
    assert emitted == KINDS, f"members nothing emits: {KINDS - emitted}"


def test_the_cli_progress_kinds_are_members():
    from vramlab.cli.drill import PROGRESS  # literals there: `vramlab drill --help` stays free of pydantic

    assert set(PROGRESS) <= KINDS


def test_the_reports_compare_kinds_and_read_data_through_the_enumeration():
    bad = []
    for pkg in ("report", "analysis"):
        for p in sorted((SRC / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                where = f"{pkg}/{p.name}:{getattr(node, 'lineno', 0)}"
                if (
                    isinstance(node, ast.Compare)
                    and isinstance(node.left, ast.Attribute)
                    and node.left.attr == "kind"
                ):
                    for c in node.comparators:
                        lits = c.elts if isinstance(c, (ast.Tuple, ast.List, ast.Set)) else [c]
                        bad += [where for x in lits if isinstance(x, ast.Constant) and x.value in KINDS]
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "data"
                    and isinstance(node.value, ast.Name)
                    and node.value.id in ("e", "ev", "event", "fault", "cap", "race", "ledger")
                ):
                    bad.append(where)  # an event's raw data: read it through its typed accessor
    assert not bad, bad


# -- each producer's data is what its payload type declares ------------------------------------------


def test_ollama_model_events_carry_declared_keys():
    from vramlab.observe.ollama import LoadedModel, changes

    a = LoadedModel("a", 4 << 30, 4 << 30, context_length=4096, expires_at="2020-01-01T00:00:00Z")
    b = LoadedModel("b", 6 << 30, 3 << 30)
    now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    out = (
        changes(None, {"a": a})
        + changes({"a": a}, {"b": b}, now)
        + changes({"b": b}, {"b": LoadedModel("b", 6 << 30, 1 << 30)}, now)
    )
    assert {d.kind for d in out} == {"model_load", "model_unload", "model_offload"}
    for d in out:
        assert not _undeclared(d.kind, d.data), d.kind


def test_the_plan_that_travels_with_the_run_carries_declared_keys():
    from vramlab.run.capacity_plan import PlanFacts, start_events

    vllm_log = ROOT / "tests" / "fixtures" / "logs" / "real" / "vllm-0.6.3-oneline-issue10517.log"
    out = start_events(
        PlanFacts(
            "qwen2.5-0.5b-instruct", "vllm", "l4", log_file=str(vllm_log), settings={"max_model_len": 4096}
        )
    )
    assert [d.kind for d in out] == ["capacity_plan", "startup_memory"]
    for d in out:
        assert not _undeclared(d.kind, d.data), d.kind
    assert start_events(PlanFacts(None, "vllm"))[0].kind == "note"


def test_drill_helpers_build_declared_data():
    from vramlab.alerts.rules import AlertRuleSpec
    from vramlab.drill.alerting import evaluate_rules
    from vramlab.drill.capacity_account import predict
    from vramlab.drill.colocation import StartResult
    from vramlab.drill.detect import Detector
    from vramlab.drill.watch import FINDING_EVENTS
    from vramlab.plandoc import StopConditions

    for knob in ("context", "balloon", "concurrency"):
        acc = predict(
            knob,
            activation_peak_bytes=1 << 30,
            max_num_batched_tokens=2048,
            free_bytes=2 << 30,
            users=4,
            prompt_tokens=512,
            kv_cache_tokens=100_000,
            max_model_len=4096,
            tokens_per_request=600,
        )
        assert not _undeclared("capacity", {"predicted_limit": acc.predicted_limit, **acc.figures})
    assert not _undeclared("engine", {"during": "ramp", **StartResult("m1", "started", None, 1.5, "").data()})
    samples = [
        SampleRecord(run_id="r", t_s=t, source="engine", name="engine.kv_cache_usage_perc", value=0.99)
        for t in (0.0, 1.0, 2.0)
    ]
    rule = AlertRuleSpec(name="kv", signal="kv_cache_usage", op=">", threshold=0.9, **{"for": "1s"})
    fired = evaluate_rules([rule], samples, [])
    assert [a["state"] for a in fired] == ["pending", "firing"]
    for a in fired:
        assert not _undeclared("alert", a)
    det = Detector(StopConditions(error_rate=0.5, window_s=2.0, min_requests=3, oom_seen=True), engine="vllm")
    f = det.on_log_line(
        1.0,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 290.00 MiB. GPU 0 has a "
        "total capacity of 22.49 GiB of which 164.00 MiB is free.",
    )
    assert f is not None and f.kind in FINDING_EVENTS
    assert not _undeclared(FINDING_EVENTS[f.kind].kind, f.data)


# -- the runners' own events, stored -------------------------------------------------------------------


def _check_stored(events: list[EventRecord]) -> set[str]:
    for e in events:
        assert type(e.kind) is str and e.kind in KINDS, e.kind
        assert not set(e.data) - payload_keys(check_kind(e.kind)), (e.kind, sorted(e.data))
    return {e.kind for e in events}


@pytest.mark.slow
def _experiment(tmp_path: Path, rollback: str, options: Any, capacity_plan: Any = None) -> tuple[Any, Any]:
    """A one-round experiment against the stub, stored in a fresh SQLite store: (RunResult, store)."""
    from vramlab.experiment.kind import ExperimentKind
    from vramlab.experiment.plan import parse_plan
    from vramlab.load.stub import StubBehaviour, StubServer
    from vramlab.run.recorder import StoreRecorder
    from vramlab.run.runner import Runner
    from vramlab.store import open_store

    store = open_store(str(tmp_path / "v.db"))

    async def go() -> Any:
        async with StubServer(StubBehaviour(ttft_s=0.005)) as srv:
            hook = EventHook()
            hook.add(StoreRecorder(store))
            plan = parse_plan(f"""
kind: experiment
name: typed
target: {{base_url: "{srv.url}", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 3, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: [2]}}
phases: {{duration_s: 0.25, drain_s: 0.5}}
rounds: 1
rollback: ['{rollback}']
""")
            return await Runner(ExperimentKind(plan, options), hook, capacity_plan).run()

    return asyncio.run(go()), store


def test_an_experiment_stores_only_enumerated_kinds_with_declared_data(tmp_path):
    from vramlab.experiment.kind import RunOptions

    res, store = _experiment(tmp_path, "exit 3", RunOptions(samplers=[]))
    kinds = _check_stored(store.events(res.run_id))
    assert {"phase_start", "phase_end", "rollback", "run_end"} <= kinds


def test_an_unknown_kind_from_an_experiments_capacity_plan_ends_the_run_failed_and_rolled_back(tmp_path):
    from vramlab.experiment.kind import RunOptions

    marker = tmp_path / "rolled"

    def misspelt() -> list[Draft]:
        # a kind mypy refuses (Draft.kind is an EventKind): the Event's own check is the net behind it
        return [Draft("capacity_plans", "a misspelt kind")]  # type: ignore[arg-type]

    # the runner records a failure of the run's body on the run and keeps the error on the result:
    # a bug in vramlab (not a VramlabError) is exit 70 for an experiment as for a drill (below)
    res, store = _experiment(tmp_path, f"touch {marker}", RunOptions(samplers=[]), misspelt)
    assert res.status == "failed" and res.exit_code == 70 and isinstance(res.error, ValueError)
    (run,) = store.list_runs()
    kinds = [e.kind for e in store.events(run.run_id)]
    assert run.status == "failed" and "unknown event kind 'capacity_plans'" in (run.stop_reason or "")
    assert marker.exists() and "rollback" in kinds and kinds[-1] == "run_end"


@pytest.mark.slow
def test_a_drill_stores_only_enumerated_kinds_with_declared_data(tmp_path):
    from vramlab.drill.kind import DrillKind
    from vramlab.drill.plan import parse_plan
    from vramlab.drill.start import run_drill_kind
    from vramlab.store import open_store

    doc = yaml.safe_load((ROOT / "examples" / "oom-drill.yaml").read_text())
    doc["target"]["sim"]["device"] = str(tmp_path / "gpu0.ledger")
    doc["baseline_s"], doc["ramp"]["step_s"], doc["recovery"]["observe_s"] = 1.0, 1.0, 1.0
    doc["recovery"]["p95_tolerance"] = 4.0
    doc.setdefault("stop_conditions", {})["wall_clock_s"] = 40
    store = open_store(str(tmp_path / "s.db"))
    runner = DrillKind(parse_plan(doc), store)
    asyncio.run(asyncio.wait_for(run_drill_kind(runner, store), 90))
    kinds = _check_stored(store.events(runner.run_id))
    assert {"step", "fault", "detect", "rollback", "run_end"} <= kinds


@pytest.mark.slow
def test_an_unknown_kind_from_a_producer_is_a_bug_exit_70(tmp_path, monkeypatch, capfd):
    import vramlab.run.capacity_plan as capacity_plan
    from vramlab.cli.main import main

    doc = yaml.safe_load((ROOT / "examples" / "oom-drill.yaml").read_text())
    doc["target"]["sim"]["device"] = str(tmp_path / "gpu0.ledger")
    doc.setdefault("stop_conditions", {})["wall_clock_s"] = 30
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(
        capacity_plan,
        "start_events",
        lambda facts: [Draft("capacity_plans", "a misspelt kind")],  # type: ignore[arg-type]
    )
    monkeypatch.delenv("VRAMLAB_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    code = main(["drill", str(plan), "--db", str(tmp_path / "s.db"), "-q", "-o", str(tmp_path / "i.md")])
    err = capfd.readouterr().err
    assert code == 70, err
    assert "internal error: ValueError: unknown event kind 'capacity_plans'" in err and "Traceback" not in err
    from vramlab.store import open_store

    with open_store(str(tmp_path / "s.db")) as store:
        (run,) = store.list_runs()
        kinds = [e.kind for e in store.events(run.run_id)]
    # the run says why it failed, and the target the drill started was stopped all the same
    assert run.status == "failed" and "unknown event kind 'capacity_plans'" in (run.stop_reason or "")
    assert "rollback" in kinds and kinds[-1] == "run_end"


def test_the_docs_table_is_the_enumeration_in_words():
    text = (ROOT / "docs" / "store-and-reports.md").read_text()
    section = text.split("### Event kinds", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (.+) \| `(\w+)` \|$", section, flags=re.M)
    assert [r[0] for r in rows] == [k.value for k in EventKind]
    for kind, doc, type_name in rows:
        k = check_kind(kind)
        assert doc.replace("\\|", "|") == k.doc and type_name == PAYLOADS[k].__name__, kind
