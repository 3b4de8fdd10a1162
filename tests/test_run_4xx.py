"""A 4xx from the server is reported in the server's own words, and a non-standard field the server
refuses (`ignore_eos`) is dropped with a note instead of failing every request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from vramlab.cli.run import summary
from vramlab.experiment.kind import ExperimentKind, RunOptions
from vramlab.experiment.plan import parse_plan
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.observe.base import FakeSampler
from vramlab.report import load_context, render
from vramlab.run.events import EventHook
from vramlab.run.recorder import StoreRecorder
from vramlab.run.runner import Runner, RunResult
from vramlab.store import open_store

SERVER_SAYS = "This model's maximum context length is 2048 tokens. However, you requested 4096 tokens"


def _run(tmp_path: Path, b: StubBehaviour, extra: str = "") -> tuple[RunResult, Any]:
    plan = parse_plan(f"""
name: r4xx
target: {{base_url: "http://placeholder", model: stub-model}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 3, seed: 1, count: 4}}}}, ignore_eos: true}}
change: {{variable: concurrency, steps: [2]}}
phases: {{duration_s: 0.3, drain_s: 0.3}}
rounds: 1
samplers: {{interval_s: 0.1}}
{extra}
""")
    store = open_store(str(tmp_path / "v.db"))

    async def go() -> RunResult:
        async with StubServer(b) as srv:
            doc = plan.model_dump(mode="json")
            doc["target"]["base_url"] = srv.url
            hook = EventHook()
            hook.add(StoreRecorder(store))
            opts = RunOptions(samplers=[FakeSampler("host", {"host.cpu_percent": [1]})])
            return await Runner(ExperimentKind(type(plan).model_validate(doc), opts), hook).run()

    return asyncio.run(go()), store


def test_a_refused_ignore_eos_is_dropped_with_the_servers_words(tmp_path):
    b = StubBehaviour(reject_fields=("ignore_eos",))
    r, store = _run(tmp_path, b)
    assert r.status == "completed" and r.errors == 0, (r.status, r.notes)
    note = next(n for n in r.notes if n.startswith("ignore_eos dropped"))
    assert "HTTP 422" in note and "Unexpected fields in the request: {'ignore_eos'}" in note
    assert "ignore_eos" in b.seen[0] and all("ignore_eos" not in body for body in b.seen[1:])
    md = render(load_context(store, r.run_id), "md")
    assert "ignore_eos dropped" in md


def test_an_accepted_ignore_eos_is_kept(tmp_path):
    b = StubBehaviour()
    r, _ = _run(tmp_path, b)
    assert r.status == "completed" and not any("ignore_eos" in n for n in r.notes)
    assert len(b.seen) > 2 and all(body.get("ignore_eos") is True for body in b.seen)


def test_a_4xx_that_stops_the_run_is_quoted_in_console_and_every_report(tmp_path):
    b = StubBehaviour(fail_status=400, fail_body=json.dumps({"error": {"message": SERVER_SAYS}}))
    r, store = _run(tmp_path, b, "stop_conditions: {error_rate: 0.2, min_requests: 3}")
    assert r.status == "stopped" and r.stop_reason is not None
    line = summary(r, store.url)["stop_reason"]  # what `vramlab run` prints (and --json carries)
    assert "the server said: HTTP 400" in line and SERVER_SAYS in line
    ctx = load_context(store, r.run_id)
    for fmt in ("md", "html"):
        assert SERVER_SAYS in render(ctx, fmt).replace("&#x27;", "'"), fmt
    doc = json.loads(render(ctx, "json"))
    assert SERVER_SAYS in doc["run"]["stop_reason"]


def test_a_baseline_that_never_answers_stops_the_run_before_the_change(tmp_path):
    # accepts the connection, never answers: every baseline request is still open at the window's end
    import time

    b = StubBehaviour(stall_until=time.monotonic() + 3600)
    r, store = _run(tmp_path, b, "load: {request_timeout_s: 2}")  # longer than the 0.3 s baseline
    assert r.status == "stopped" and r.exit_code != 0 and r.stop_reason is not None
    assert r.stop_reason.condition == "baseline"
    assert "baseline broken, nothing changed: no baseline request came back" in r.stop_reason.message
    phases = {rec.phase for rec in store.requests(r.run_id)}
    assert phases == {"baseline"}, phases  # no treatment, no recovery was sent


def test_a_baseline_where_every_request_fails_is_refused_in_the_servers_words(tmp_path):
    b = StubBehaviour(fail_status=404, fail_body=json.dumps({"error": {"message": "model `x` not found"}}))
    r, store = _run(
        tmp_path, b, "stop_conditions: {error_rate: 0.9, min_requests: 100000}"
    )  # the stop never fires
    assert r.status == "stopped" and r.stop_reason is not None and r.stop_reason.condition == "baseline"
    assert (
        "model `x` not found" in r.stop_reason.message and "baseline requests failed" in r.stop_reason.message
    )
    assert {rec.phase for rec in store.requests(r.run_id)} == {"baseline"}
