"""Reports rendered from a stored synthetic run: the numbers that must appear, every section,
HTML that parses and stands alone, JSON that round-trips, and the section registry."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

import _synthetic_run as synth
from _narrow import some, stand_in
from vramlab.report import load_context, render
from vramlab.report.blocks import Text
from vramlab.report.sections import ReportContext, Section
from vramlab.store import open_store


@pytest.fixture(scope="module")
def ctx() -> ReportContext:
    return ReportContext.build(*synth.build())


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: list[str] = []
        self.refs: list[str] = []
        self.text: list[str] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_data(self, data):
        self.text.append(data)


def test_markdown_from_the_store(store_url):
    with open_store(store_url) as store:
        synth.insert(store)
        md = render(load_context(store, "7f3a"), "md")
    headings = [ln for ln in md.splitlines() if ln.startswith("#")]
    # The answer first; the plan as run and the environment last, in the appendix.
    assert headings == [
        "# vramlab experiment 7f3a91bc: concurrency-ramp",
        "## Answer",
        "## Summary",
        "## Warnings",
        "## Baseline, treatment and recovery by round",
        "## Thresholds",
        "## Per step",
        "## Charts",
        "## Stability across rounds",
        "## Return to baseline",
        "## Stops, rollbacks and other events",
        "## Notes",
        "## Appendix",
        "### Plan",
        "### Environment",
    ], headings
    # baseline P50/P95/P99 (200/290/298), the concurrency-8 step P95, the 503 step's error rate
    assert "| 0 | baseline | 21 | 0.0% | 2.00 | 290.0 | – | – | 10.0% | 70.25 |" in md  # signals side by side
    assert "| 0 | baseline | 128.00 | 72.5 | 200.0 | 298.0 | 300.0 | 292.0 |" in md  # latency detail
    assert "| 1 | treatment | 2 | 8 | 21 | 23.8% |" in md and "992.5" in md
    assert "| 2 | yes | 5.2 s | 290.0 | 1,060.0 |" in md
    assert "| treatment | 2 | error_rate | r0: 0.0%, r1: 23.8%, r2: 0.0% | 23.8% | – | round 1 |" in md
    assert "Returned to baseline: round 0 yes at once; round 1 yes at once; round 2 yes after 5.2 s" in md
    assert "| 95.0 | stop_condition | round 1 treatment step 2 | error rate 23.8% > 20% for 5 s |" in md
    assert "rollback: curl -X POST http://127.0.0.1:8000/reset" in md
    assert "| gpu_name | NVIDIA H100 80GB HBM3 |" in md and "| target.environment | test |" in md
    assert "Hypothesis: P95 end-to-end latency stays under 2 s up to concurrency 8" in md
    assert "- prometheus source not configured: no engine histograms" in md
    assert "- 120.0 s: engine /metrics scrape took 1.2 s" in md
    assert "72.00" in md  # GPU memory max at concurrency 8: 70 + 8/4 GiB
    assert "## Thresholds" in md and "| 1 | treatment | 2 | 8 | 23.8% BREACH | 992.5 ms BREACH |" in md
    assert (
        "Thresholds held in every round up to: concurrency 4; first breach: round 0 treatment at "
        "concurrency 8, p95_e2e_ms 990.0 ms vs limit 950.0 ms"
    ) in md


def test_html_is_self_contained_and_parses(ctx):
    page = render(ctx, "html")
    p = _Collector()
    p.feed(page)
    p.close()
    assert p.tags.count("svg") == 4 and "script" not in p.tags
    assert p.refs == []  # nothing fetched from elsewhere
    for sid in (
        "summary",
        "plan",
        "environment",
        "phases",
        "steps",
        "charts",
        "stability",
        "recovery",
        "events",
    ):
        assert sid in p.ids
    text = " ".join(p.text)
    assert "E2E latency P95 per concurrency" in text and "KV cache usage over time" in text
    assert "992.5" in text and "round 1 E2E P95" in text and "baseline P95 range" in text


def test_html_escapes_stored_text():
    run, reqs, samples, events = synth.build()
    run = run.model_copy(update={"name": "<script>alert(1)</script>", "notes": ["a <b>note</b> & more"]})
    page = render(ReportContext.build(run, reqs, samples, events), "html")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a &lt;b&gt;note&lt;/b&gt; &amp; more" in page


def test_json_report(ctx):
    data = json.loads(render(ctx, "json"))
    assert data["schema"] == "vramlab.report/1" and data["run"]["run_id"] == "7f3a91bc"
    assert data["complete"] is True and len(data["phases"]) == 9 and len(data["steps"]) == 15
    base = data["phases"][0]
    assert (base["phase"], base["requests"]["e2e"]["p95"], base["requests"]["count"]) == (
        "baseline",
        290.0,
        21,
    )
    rec2 = [r for r in data["recovery"] if r["round"] == 2][0]
    assert rec2["returned"] is True and 4.0 < rec2["after_s"] < 6.5
    spike = [s for s in data["stability"] if s["spikes"] and s["metric"] == "error_rate"][0]
    assert spike["spikes"] == [1] and spike["by_round"]["1"] == pytest.approx(5 / 21)
    d = data["comparisons"][0]["deltas"]["treatment"]["e2e_p95_ms"]
    assert d["baseline"] == 290.0 and d["delta"] == pytest.approx(d["value"] - 290.0)
    assert [e["kind"] for e in data["events"]].count("stop_condition") == 1
    assert data["highest_passing_value"] == 4.0 and len(data["thresholds"]) == 30


def test_incomplete_run_is_marked():
    run, reqs, samples, events = synth.build(status="running")
    cut = [r for r in reqs if (r.end_s or 0) < 100]  # killed at 100 s
    md = render(
        ReportContext.build(
            run, cut, [s for s in samples if s.t_s < 100], [e for e in events if e.t_s < 100]
        ),
        "md",
    )
    assert "_status running (incomplete)_" in md
    assert "incomplete run (status running)" in md
    assert "| 1 | treatment | 2 |" in md  # what was stored before the kill is reported
    assert "only 2 round" not in md  # the run was cut short, not planned short


def test_run_without_requests_renders():
    run, _, _, events = synth.build()
    md = render(ReportContext.build(run, [], [], events[:1]), "md")
    assert "No requests were stored for this run." in md and "## Charts" not in md


def test_a_caller_adds_sections_for_drills_only_and_for_its_document_only():
    def build(ctx):
        return [Text(f"incident for {ctx.run.run_id}: {len(ctx.requests)} requests")]

    mine = [
        Section("test-incident", "Test incident", build, order=15, applies=lambda c: c.run.kind == "drill")
    ]
    run, reqs, samples, events = synth.build()
    md_exp = render(ReportContext.build(run, reqs, samples, events), "md", extra=mine)
    drill = run.model_copy(update={"kind": "drill"})
    md_drill = render(ReportContext.build(drill, reqs, samples, events), "md", extra=mine)
    assert "Test incident" not in md_exp
    assert "## Test incident\n\nincident for 7f3a91bc: 315 requests" in md_drill
    assert md_drill.index("## Summary") < md_drill.index("## Test incident") < md_drill.index("## Plan")
    # nothing stays behind: the next document holds only the built-in sections
    assert "Test incident" not in render(ReportContext.build(drill, reqs, samples, events), "md")


def test_notes_said_once_and_warnings_kept_apart():
    from vramlab.records import EventRecord

    run, reqs, samples, events = synth.build()
    run = run.model_copy(
        update={"notes": ["no NVML: GPU samples missing", "engine /metrics scrape took 1.2 s"]}
    )
    events.append(
        EventRecord(run_id=run.run_id, t_s=0.2, kind="note", message="no NVML: GPU samples missing")
    )
    md = render(ReportContext.build(run, reqs, samples, events), "md")
    notes = md.split("## Notes", 1)[1]
    assert notes.count("no NVML") == 1 and "- 0.2 s: no NVML: GPU samples missing" in notes
    assert "scrape took" not in notes and md.count("engine /metrics scrape took 1.2 s") == 1


def test_prediction_beside_observed_queueing():
    from vramlab.records import SampleRecord

    run, reqs, samples, events = synth.build()
    run = run.model_copy(update={"fixed": {**run.fixed, "predicted": {"max_concurrency": 6}}})
    for r in reqs:
        if r.request_id.endswith("-0"):  # one waiting sample per window, mid-window
            waiting = {8.0: 5.0, 4.0: 0.0, 2.0: 0.0}.get(
                r.step_value or 0.0, 1.0 if r.phase == "baseline" else 0.0
            )
            if r.step_value == 4.0 and r.round == 0:
                waiting = 3.0  # one round only: not a majority
            samples.append(
                SampleRecord(
                    run_id=run.run_id,
                    t_s=some(r.sent_s) + 5,
                    source="engine",
                    name="engine.num_requests_waiting",
                    value=waiting,
                )
            )
    ctx = ReportContext.build(run, reqs, samples, events)
    assert ctx.analysis.queueing_from_value == 8.0
    md = render(ctx, "md")
    assert (
        "Engine queue longer than in baseline from concurrency 8 (waiting max 5); longest: 5 at concurrency 8"
        in md
    )
    assert (
        "Capacity model predicted max concurrency 6; observed: thresholds held up to 4, queueing from 8"
    ) in md
    assert "unsafe side" not in md  # 6 lies between the last step that held (4) and the first breach (8)
    over = run.model_copy(update={"fixed": {**run.fixed, "predicted": {"max_concurrency": 12}}})
    md = render(ReportContext.build(over, reqs, samples, events), "md")
    assert (
        "Capacity model predicted max concurrency 12; observed: thresholds held up to 4, queueing from 8 — the "
        "prediction was on the unsafe side (at or above the first breach, concurrency 8)"
    ) in md


def test_host_cpu_and_engine_rss_are_in_the_report_not_only_in_json():

    from vramlab.records import SampleRecord
    from vramlab.report.window_tables import host_line

    def smp(name: str, t: float, v: float) -> SampleRecord:
        return SampleRecord(run_id="r", t_s=t, source="host", name=name, value=v)

    ctx = stand_in(
        samples=[
            smp("host.cpu_percent", 1, 40.0),
            smp("host.cpu_percent", 2, 97.4),
            smp("host.target_rss_bytes", 1, 1.5 * 2**30),
            smp("gpu.memory_used_bytes", 1, 9.0),
        ]
    )
    assert host_line(ctx) == "Host (sampled): CPU max 97 %, engine process RSS max 1.50 GiB"
    assert host_line(stand_in(samples=[smp("gpu.memory_used_bytes", 1, 9.0)])) is None


def test_the_too_few_rounds_warning_is_said_once():
    from vramlab.records import EventRecord

    run, reqs, samples, events = synth.build()
    # as a drill writes it (drill/kind.py): told by its field, not its text
    said = EventRecord(
        run_id=run.run_id,
        t_s=0.1,
        kind="warning",
        message="rounds: 1 is fewer than 3; a one-off",
        data={"plan_field": "rounds"},
    )
    full = ReportContext.build(run, reqs, samples, [*events, said])
    one = ReportContext.build(
        run,
        [r for r in reqs if r.round == 1],
        samples,
        [e for e in [*events, said] if e.round in (None, 1)],
    )
    assert not full.analysis.few_rounds and one.analysis.few_rounds
    # three rounds stored: the event is the only one to say it; one round: the analysis says it already
    assert "rounds: 1 is fewer than 3" in render(full, "md").split("## Warnings", 1)[1].split("\n## ", 1)[0]
    warned = render(one, "md").split("## Warnings", 1)[1].split("\n## ", 1)[0]
    assert "only 1 round(s)" in warned and "rounds: 1 is fewer than 3" not in warned
