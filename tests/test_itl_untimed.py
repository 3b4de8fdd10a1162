"""Issue #15: how many inter-token gaps could not be timed (a token read together with later bytes)
is stored per request (`RequestRecord.itl_untimed_gaps`), survives worker processes, the store and
its migration, and every report quotes the same counts as the stored rows, marking a window whose
ITL rests on few gaps. Correctness only: no speed is asserted."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

import _synthetic_run as synth
from vramlab.analysis.stats import ITL_UNTIMED_WARN, summarize_requests
from vramlab.experiment.kind import ExperimentKind, RunOptions
from vramlab.experiment.plan import parse_plan
from vramlab.load.client import OpenAIClient, RequestResult
from vramlab.load.driver import LoadShape, Window, drive
from vramlab.load.prompts import Prompt, cycle
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.load.workers import ClientConfig, WorkerPool
from vramlab.records import RequestRecord, RunRecord
from vramlab.report import load_context
from vramlab.report.blocks import Bullets, Table
from vramlab.report.json import render as render_json
from vramlab.report.sections import build_document
from vramlab.run.events import EventHook
from vramlab.run.recorder import StoreRecorder
from vramlab.run.runner import Runner
from vramlab.run.window import request_record
from vramlab.store import open_store, resolve_url

PROMPTS = [Prompt(f"prompt {i}", 2, 8) for i in range(4)]


# -- the worker pool ships it -------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_untimed_gaps_come_back_from_every_worker(workers: int) -> None:
    """All tokens in one burst (token_s=0): most arrive in one read, so their gaps are untimed; the
    results that crossed a process boundary keep which tokens were coalesced, and the stored row says
    how many gaps were left out of itl_ms."""
    results: list[RequestResult] = []
    shape = LoadShape("open", 8, 100.0, "poisson", seed=1)
    win = Window(duration_s=10, requests=12, drain_s=2)

    async def go() -> None:
        async with StubServer(StubBehaviour(ttft_s=0.005, token_s=0.0)) as srv:
            if workers == 1:
                async with OpenAIClient(srv.url, "m") as client:
                    await drive(client, cycle(PROMPTS), shape, win, results.append)
            else:
                async with WorkerPool(workers, ClientConfig(srv.url, "m", max_connections=16)) as pool:
                    await pool.drive(PROMPTS, shape, win, results.append)

    asyncio.run(go())
    assert len(results) == 12 and all(r.ok for r in results)
    assert any(r.coalesced for r in results)  # the burst was read together: carried over the pipe
    rows = [request_record(r, "0123abcd", 0.0, 0, "baseline", 0, None) for r in results]
    for res, row in zip(results, rows, strict=True):
        gaps = len(res.token_times) - 1
        assert row.itl_untimed_gaps is not None and 0 <= row.itl_untimed_gaps <= gaps
        assert row.itl_untimed_gaps + len(row.itl_ms) == gaps  # every gap is timed or counted, once
    assert sum(r.itl_untimed_gaps or 0 for r in rows) > 0


# -- the store and its migration ------------------------------------------------------------------------


def _req(i: int, itl: list[float], untimed: int | None) -> RequestRecord:
    return RequestRecord(
        run_id="0123abcd",
        round=0,
        phase="baseline",
        request_id=f"r{i}",
        status_code=200,
        sent_s=float(i),
        end_s=i + 0.5,
        e2e_ms=500.0,
        itl_ms=itl,
        itl_untimed_gaps=untimed,
    )


def test_a_version_3_store_upgrades_and_old_rows_read_unknown(store_url) -> None:
    """A store written before the column (schema 3, rows without itl_untimed_gaps) opens, gains the
    column once (reopening changes nothing), keeps its old rows (count unknown: None) and stores new ones."""
    import sqlalchemy as sa

    from vramlab.store import schema
    from vramlab.store.migrations import LATEST

    engine = sa.create_engine(resolve_url(store_url))
    v3 = sa.MetaData()
    for t in (schema.schema_version, schema.runs, *schema.RUN_TABLES):
        sa.Table(t.name, v3, *[c._copy() for c in t.columns if c.name != "itl_untimed_gaps"])
    v3.create_all(engine)
    with engine.begin() as conn:
        for v in (1, 2, 3):
            conn.execute(sa.text(f"INSERT INTO schema_version (version, applied_at) VALUES ({v}, 0)"))
        conn.execute(
            sa.insert(v3.tables["runs"]).values(
                run_id="0123abcd",
                kind="experiment",
                name="old",
                plan={},
                plan_hash="",
                fixed={},
                target={},
                change={},
                started_at=1.0,
                status="completed",
                notes=[],
            )
        )
        conn.execute(
            sa.insert(v3.tables["requests"]).values(
                run_id="0123abcd",
                round=0,
                phase="baseline",
                step=0,
                request_id="old",
                attempt=0,
                itl_ms=[5.0, 6.0],
                status_code=200,
            )
        )
    engine.dispose()
    assert LATEST >= 4
    for _ in range(2):  # the second open finds nothing to do
        with open_store(store_url) as store:
            old = store.requests("0123abcd")
    assert [(r.request_id, r.itl_ms, r.itl_untimed_gaps) for r in old] == [("old", [5.0, 6.0], None)]
    with open_store(store_url) as store:
        store.add_requests("0123abcd", [_req(1, [4.0, 4.5], 3), _req(2, [], 0)])
        back = store.requests("0123abcd")
    assert [r.itl_untimed_gaps for r in back] == [None, 3, 0]
    with open_store(store_url) as store:
        doc = build_document(load_context(store, "0123abcd"))
    summary = [
        i
        for s in doc.sections
        if s.id == "summary"
        for b in s.blocks
        if isinstance(b, Bullets)
        for i in b.items
    ]
    # The old row's gaps are timed (its itl_ms); its untimed count is unknown, so the sum is of the rows that know.
    line = next(i for i in summary if i.startswith("ITL P99"))
    assert "over 4 timed gaps; 3 (" in line, line


# -- the report quotes the stored counts ---------------------------------------------------------------


def _plan(url: str, tokens: int) -> object:
    return parse_plan(f"""
name: untimed
target: {{base_url: "{url}", model: m}}
fixed: {{input: {{synthetic: {{prompt_tokens: 4, output_tokens: {tokens}, count: 3}}}}}}
change: {{variable: concurrency, baseline: 2, steps: [4]}}
phases: {{duration_s: 0.8, drain_s: 2}}
rounds: 1
samplers: {{interval_s: 0.2, sources: []}}
""")


def _stored_run(tmp_path: Path, workers: int, token_s: float, tokens: int):
    store = open_store(str(tmp_path / "u.db"))

    async def go() -> object:
        async with StubServer(StubBehaviour(ttft_s=0.005, token_s=token_s)) as srv:
            hook = EventHook()
            hook.add(StoreRecorder(store), critical=True)
            opts = RunOptions(samplers=[], workers=workers)
            opts.capture_environment = False
            return await Runner(ExperimentKind(_plan(srv.url, tokens), opts), hook).run()  # type: ignore[arg-type]

    res = asyncio.run(go())
    assert res.status == "completed"  # type: ignore[attr-defined]
    return store, res.run_id  # type: ignore[attr-defined]


_SENTENCE = re.compile(
    r"^ITL P99 (\S+) ms over ([\d,]+) timed gaps; ([\d,]+) \((\d+\.\d)%\) read together with "
    r"later bytes, not timed"
)
_CELL = re.compile(r"^([\d,]+) / ([\d,]+) \((\d+\.\d)%\)$")


def _n(s: str) -> int:
    return int(s.replace(",", ""))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_stores_the_counts_and_every_report_quotes_them(tmp_path: Path, workers: int) -> None:
    """All tokens in one burst: most gaps untimed. Stored on every row; the summary sentence, the
    per-phase detail table and the JSON report all give the sums of the stored rows, and every window
    is marked (far over the threshold)."""
    store, run_id = _stored_run(tmp_path, workers, token_s=0.0, tokens=8)
    rows = [r for r in store.requests(run_id) if r.ok]
    assert rows and all(r.itl_untimed_gaps is not None for r in rows)
    timed, untimed = sum(len(r.itl_ms) for r in rows), sum(r.itl_untimed_gaps or 0 for r in rows)
    assert untimed > 0
    ctx = load_context(store, run_id)
    doc = build_document(ctx)
    data = json.loads(render_json(ctx, doc))
    store.close()
    assert data["itl_gaps"]["timed"] == timed and data["itl_gaps"]["untimed"] == untimed
    summary = next(s for s in doc.sections if s.id == "summary")
    items = [i for b in summary.blocks if isinstance(b, Bullets) for i in b.items]
    m = next(m for i in items if (m := _SENTENCE.match(i)))
    assert (_n(m.group(2)), _n(m.group(3))) == (timed, untimed)
    assert float(m.group(4)) == pytest.approx(100 * untimed / (timed + untimed), abs=0.05)
    assert any(i.startswith("ITL marked where over 10%") for i in items)
    # Per phase: the detail table's cell is the JSON's window counts, which add up to the stored rows.
    phases = next(s for s in doc.sections if s.id == "phases")
    detail = next(b for b in phases.blocks if isinstance(b, Table) and b.caption == "Latency detail")
    cells = {row[1]: row[detail.headers.index("ITL gaps timed / untimed")] for row in detail.rows}
    by_phase = {p["phase"]: p["itl_gaps"] for p in data["phases"]}
    assert sum(p["timed"] for p in by_phase.values()) == timed
    assert sum(p["untimed"] for p in by_phase.values()) == untimed
    for name, cell in cells.items():
        assert "(ITL " in name and "untimed)" in name  # marked: well over the threshold
        phase = name.split(" ")[0]
        c = _CELL.match(cell)
        assert c, cell
        assert (_n(c.group(1)), _n(c.group(2))) == (by_phase[phase]["timed"], by_phase[phase]["untimed"])
        assert by_phase[phase]["marked"] is True


def test_a_window_is_marked_above_the_threshold_and_not_below(tmp_path: Path) -> None:
    """The same synthetic run twice: one step's requests with 2 untimed gaps beside 16 timed (11.1 %,
    over 10 %), the others 1 beside 16 (5.9 %). Only that step carries the mark, in both tables and
    the summary; the JSON says marked for it alone."""
    run, reqs, samples, events = synth.build()
    marked_key = (1, "treatment", 1)
    fixed = []
    for r in reqs:
        key = (r.round, r.phase, r.step)
        fixed.append(
            r.model_copy(
                update={
                    "itl_ms": [5.0] * 16 if r.itl_ms else [],
                    "itl_untimed_gaps": (2 if key == marked_key else 1) if r.itl_ms else 0,
                }
            )
        )
    with open_store(str(tmp_path / "m.db")) as store:
        store.create_run(run)
        store.add_requests(run.run_id, fixed)
        store.add_samples(run.run_id, samples)
        store.add_events(run.run_id, events)
        ctx = load_context(store, run.run_id)
        doc = build_document(ctx)
        data = json.loads(render_json(ctx, doc))
    steps = next(s for s in doc.sections if s.id == "steps")
    for table in (b for b in steps.blocks if isinstance(b, Table)):
        for row in table.rows:
            row_key = (int(row[0]), row[1].split(" ")[0], int(row[2]) if row[2] != "–" else None)
            assert ("(ITL 11.1% untimed)" in row[1]) == (row_key == marked_key), (table.caption, row)
    assert [(s["round"], s["phase"], s["step"]) for s in data["steps"] if s["itl_gaps"]["marked"]] == [
        marked_key
    ]
    assert not any(p["itl_gaps"]["marked"] for p in data["phases"])  # a whole phase dilutes it under 10 %
    assert data["itl_gaps"]["marked"] is False and data["itl_gaps"]["mark_above_share"] == ITL_UNTIMED_WARN
    items = [
        i
        for s in doc.sections
        if s.id == "summary"
        for b in s.blocks
        if isinstance(b, Bullets)
        for i in b.items
    ]
    line = next(i for i in items if i.startswith("ITL marked where"))
    assert line.endswith("round 1 treatment step 1 (4)"), line


def test_summary_counts_and_the_threshold_edge() -> None:
    """10 % untimed is not marked (the mark is for more than the threshold); just over it is; rows
    that never stored the count leave it unknown, not zero; failed requests count nowhere."""

    def summary(untimed: Sequence[int | None], failed: int = 0):
        reqs = [_req(i, [5.0] * 9, u) for i, u in enumerate(untimed)]
        reqs += [
            _req(100 + i, [5.0], 50).model_copy(update={"status_code": 503, "error_class": "http_5xx"})
            for i in range(failed)
        ]
        return summarize_requests(reqs, 10.0)

    at = summary([1] * 10, failed=3)  # 10 of 100 gaps
    assert (at.itl_timed, at.itl_untimed, at.itl_few_timed) == (90, 10, False)
    assert at.itl_untimed_share == pytest.approx(0.10)
    over = summary([1] * 9 + [2])  # 11 of 101
    assert (over.itl_untimed, over.itl_few_timed) == (11, True)
    unknown = summary([None, None])
    assert (unknown.itl_timed, unknown.itl_untimed, unknown.itl_untimed_share, unknown.itl_few_timed) == (
        18,
        None,
        None,
        False,
    )


def test_an_old_run_without_counts_says_so(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "o.db")) as store:
        store.create_run(RunRecord(run_id="0123abcd", name="old", started_at=1.0, status="completed"))
        store.add_requests("0123abcd", [_req(1, [4.0, 5.0], None)])
        doc = build_document(load_context(store, "0123abcd"))
    items = [
        i
        for s in doc.sections
        if s.id == "summary"
        for b in s.blocks
        if isinstance(b, Bullets)
        for i in b.items
    ]
    assert "ITL P99 5.0 ms over 2 timed gaps; how many could not be timed was not recorded" in items
