"""The capacity plan and the start-up memory as typed records: what the runner stores reads back
field by field, rows an older vramlab stored still load, and a note about the plan is told by its
`by` field (its text only for rows stored before that field)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from vramlab.records import EventRecord
from vramlab.records.capacity_plan import (
    CAPACITY_PLAN_NOTE,
    CapacityEstimate,
    PlanFactsRecord,
    StartupObservation,
    as_int,
    capacity_plan_record,
    is_capacity_plan_note,
    startup_memory_record,
)
from vramlab.units import GIB


def _ev(kind: str, data: dict[str, Any], message: str = "") -> EventRecord:
    return EventRecord(run_id="r1", t_s=0.0, kind=kind, message=message, data=data)


def test_the_stored_plan_reads_back_into_its_fields() -> None:
    from vramlab.run.capacity_plan import PlanFacts, start_events

    facts = PlanFacts("llama-3.1-8b-instruct", "vllm", "h100-80gb", None, None, {"max_model_len": 8192})
    (draft,) = start_events(facts)
    kind, data = draft.kind, dict(draft.data)
    assert kind == "capacity_plan"
    rec = capacity_plan_record(_ev(kind, data))
    assert rec.facts == PlanFactsRecord(
        "llama-3.1-8b-instruct", "vllm", "h100-80gb", None, None, {"max_model_len": 8192}, data["facts"]
    )
    # the stored facts are what the record writes: one form for the writer and the readers
    assert facts.record().to_json() == data["facts"] == rec.facts.to_json()
    est = rec.estimate
    assert est is not None and est.engine == "vllm" and est.gpu == data["estimate"]["gpu"]
    assert est.max_model_len == 8192 and est.kv_cache_tokens == data["estimate"]["kv_cache_tokens"]
    assert [c.name for c in est.components] == [c["name"] for c in data["estimate"]["components"]]
    assert sum(c.bytes for c in est.components) == sum(c["bytes"] for c in data["estimate"]["components"])
    assert est.document is data["estimate"]


def test_an_old_row_loads_with_what_it_has() -> None:
    # no engine_version, no bands, a component without low/high, no facts at all
    old = {"estimate": {"model": "m", "engine": "vllm", "components": [{"name": "weights", "bytes": 5}]}}
    rec = capacity_plan_record(_ev("capacity_plan", old))
    assert rec.facts is None and rec.estimate is not None
    (w,) = rec.estimate.components
    assert (w.bytes, w.low_bytes, w.high_bytes) == (5, 5, 5)
    assert rec.estimate.engine_version is None and rec.estimate.kv_cache_tokens is None
    assert dict(rec.estimate.settings) == {}
    assert capacity_plan_record(_ev("capacity_plan", {})) == capacity_plan_record(
        _ev("capacity_plan", {"facts": {}, "estimate": {}})
    )
    facts = PlanFactsRecord.from_json({"model": "m", "gpu_memory_gib": 24})
    assert (
        facts.gpu_memory_gib == 24.0
        and facts.engine is None
        and facts.to_json()
        == {
            "model": "m",
            "gpu_memory_gib": 24,
        }
    )


def test_the_start_up_observation_reads_its_figures() -> None:
    obs = {
        "engine": "llama.cpp",
        "weights_bytes": 2 * GIB,
        "kv_cache_tokens": 4096,
        "basis": "measured",
        "settings": {"parallel": 2},
        "extra": {"kv_bytes_per_token": 1024.0, "host_compute_bytes": 300},
    }
    rec = startup_memory_record(_ev("startup_memory", {"source": "start-up log x.log", "observation": obs}))
    o = rec.observation
    assert rec.source == "start-up log x.log" and o is not None
    assert (o.weights_bytes, o.kv_cache_bytes, o.kv_cache_tokens) == (2 * GIB, None, 4096)
    assert dict(o.byte_figures) == {"weights_bytes": 2 * GIB}
    assert o.extra_number("kv_bytes_per_token") == 1024.0 and o.extra_number("absent") is None
    assert startup_memory_record(_ev("startup_memory", {})).observation is None
    assert StartupObservation.from_json({}).extra == {}


def test_as_int_reads_what_json_holds() -> None:
    assert [as_int(v) for v in (3, 3.9, "4", True, "x", None, [1])] == [3, 3, 4, 1, None, None, None]


def test_a_plan_note_is_told_by_its_field_not_its_text() -> None:
    said = _ev("note", {"by": CAPACITY_PLAN_NOTE}, "no plan: the card is not known")
    assert is_capacity_plan_note(said)
    # an operator's note that happens to start with the words is not one
    assert not is_capacity_plan_note(_ev("note", {"by": "alice", "at": 1.0}, "capacity plan: looks off"))
    # rows stored before the field: a note, or a drill's warning, by its text
    assert is_capacity_plan_note(_ev("note", {}, "capacity plan: not computed: x"))
    assert is_capacity_plan_note(_ev("warning", {}, "capacity plan: not computed: x"))
    assert not is_capacity_plan_note(_ev("warning", {}, "rounds: 1 is fewer than 3"))


def test_the_missing_fact_note_carries_the_field() -> None:
    from vramlab.run.capacity_plan import PlanFacts, start_events

    (draft,) = start_events(PlanFacts("llama-3.1-8b-instruct", "vllm"))
    kind, message, data = draft.kind, draft.message, draft.data
    assert kind == "note" and data == {"by": CAPACITY_PLAN_NOTE} and "card is not known" in message


def test_the_runner_stores_the_plan_note_with_its_field(tmp_path: Path) -> None:
    from vramlab.analysis.composition import compose
    from vramlab.experiment.kind import ExperimentKind, RunOptions
    from vramlab.experiment.plan import parse_plan
    from vramlab.load.stub import StubBehaviour, StubServer
    from vramlab.records import emit as E
    from vramlab.records.emit import Draft
    from vramlab.run.events import EventHook
    from vramlab.run.recorder import StoreRecorder
    from vramlab.run.runner import Runner
    from vramlab.store import open_store

    store = open_store(str(tmp_path / "v.db"))

    def no_plan() -> list[Draft]:
        return [E.NOTE("the plan could not be made: no card", {"by": CAPACITY_PLAN_NOTE})]

    async def go() -> str:
        async with StubServer(StubBehaviour(ttft_s=0.005)) as srv:
            hook = EventHook()
            hook.add(StoreRecorder(store))
            plan = parse_plan(f"""
kind: experiment
name: noted
target: {{base_url: "{srv.url}", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 3, seed: 1, count: 2}}}}}}
change: {{variable: concurrency, steps: [1]}}
phases: {{duration_s: 0.2, drain_s: 0.3}}
rounds: 1
""")
            kind = ExperimentKind(plan, RunOptions(samplers=[]))
            return (await Runner(kind, hook, no_plan).run()).run_id

    run_id = asyncio.run(asyncio.wait_for(go(), 60))
    with store:
        events = store.events(run_id)
        run = store.get_run(run_id)
    (note,) = [e for e in events if e.message == "the plan could not be made: no card"]
    assert note.kind == "note" and note.data == {"by": CAPACITY_PLAN_NOTE}
    # the composition's "why no plan" comes from the field: the text does not start "capacity plan:"
    comp = compose(run, [], events, [], None)
    assert comp.notes == ["the plan could not be made: no card"] and comp.plan is None


def test_estimate_from_json_keeps_the_stored_document() -> None:
    doc: dict[str, object] = {"engine": "sglang", "settings": {"max_num_seqs": 48}, "block_size": "16"}
    est = CapacityEstimate.from_json(doc)
    assert est.document is doc and est.block_size == 16 and est.settings == {"max_num_seqs": 48}
