"""The report opens with the answer: the verdict on the hypothesis (held, not held, not judged) with
its figure, plan against measured folded over the windows, and the key chart; the full plan and the
environment close the report as its appendix. The verdict is read from the rendered document and
checked against the tables the report prints beside it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import _synthetic_run as synth
from vramlab.analysis.composition import Figure, Row
from vramlab.report import render
from vramlab.report.answer import folded_rows
from vramlab.report.blocks import Bullets, Chart, Table, Verdict
from vramlab.report.sections import ReportContext, build_document

GIB = 2**30


def _ctx(metrics: dict[str, float] | None = None, slow_recovery: bool = False, **run: Any) -> ReportContext:
    rec, reqs, samples, events = synth.build()
    plan = dict(rec.plan)
    if metrics is not None:
        plan["metrics"] = metrics
    rec = rec.model_copy(update={"plan": plan, **run})
    if slow_recovery:  # round 2's recovery stays 900 ms slower than its baseline for the whole window
        reqs = [
            r.model_copy(update={"e2e_ms": (r.e2e_ms or 0) + 900.0, "end_s": (r.end_s or 0) + 0.9})
            if r.round == 2 and r.phase == "recovery"
            else r
            for r in reqs
        ]
    return ReportContext.build(rec, reqs, samples, events)


def _answer(ctx: ReportContext) -> tuple[Verdict, list[Any]]:
    doc = build_document(ctx)
    assert doc.sections[0].id == "answer"  # first, before the summary
    blocks = doc.sections[0].blocks
    verdict = blocks[0]
    assert isinstance(verdict, Verdict)
    return verdict, blocks


def _thresholds(ctx: ReportContext) -> list[dict[str, str]]:
    section = next(s for s in build_document(ctx).sections if s.id == "thresholds")
    table = next(b for b in section.blocks if isinstance(b, Table))
    return [dict(zip(table.headers, row, strict=True)) for row in table.rows]


def _number(cell: str) -> float:
    return float(re.sub(r"[^\d.]", "", cell.split()[0].replace(",", "")))


def test_a_hypothesis_that_held_quotes_the_cell_closest_to_its_limit():
    ctx = _ctx({"p95_e2e_ms": 2000.0, "error_rate": 0.5})
    verdict, blocks = _answer(ctx)
    assert verdict.status == "held", verdict
    assert verdict.headline.startswith(
        "The hypothesis held: every threshold held in all 3 rounds up to concurrency 8 and every round "
        "returned to baseline; closest to its limit: "
    )
    m = re.search(
        r"closest to its limit: (\w+) (.+?) of (.+?), round (\d+) (\w+)(?: at concurrency (\S+))?$",
        verdict.headline,
    )
    assert m, verdict.headline
    metric, value, limit, rnd, phase, conc = m.groups()
    rows = _thresholds(ctx)
    column = next(h for h in rows[0] if h.startswith(metric))
    # (here round 2's recovery, slow for its first 4 s: recovery windows are held to the limits too)
    quoted = next(r for r in rows if (r["round"], r["phase"], r["concurrency"]) == (rnd, phase, conc or "–"))
    assert quoted[column] == f"{value} ok" and f"≤ {limit})" in column
    # no other cell of the table is nearer its limit
    limits = {h: _number(h.split("≤ ")[1]) for h in rows[0] if "≤" in h}
    nearest = max(_number(r[h]) / lim for r in rows for h, lim in limits.items() if r[h] != "–")
    assert _number(value) / _number(limit) == pytest.approx(nearest)
    assert "Hypothesis: P95 end-to-end latency stays under 2 s up to concurrency 8" in verdict.details
    # the key chart is the hypothesis's figure, and the Charts section does not draw it again
    key = next(b for b in blocks if isinstance(b, Chart))
    assert key.title == "E2E latency P95 per concurrency"
    charts = next(s for s in build_document(ctx).sections if s.id == "charts")
    assert key.title not in [b.title for b in charts.blocks if isinstance(b, Chart)]


def test_a_round_that_did_not_return_to_baseline_means_it_did_not_hold():
    ctx = _ctx({"p95_e2e_ms": 2000.0, "error_rate": 0.5}, slow_recovery=True)
    verdict, _ = _answer(ctx)
    assert verdict.status == "not-held"
    assert verdict.headline.startswith("The hypothesis did not hold: round 2 did not return to baseline")
    recovery = next(s for s in build_document(ctx).sections if s.id == "recovery")
    table = next(b for b in recovery.blocks if isinstance(b, Table))
    assert [row[:2] for row in table.rows] == [["0", "yes"], ["1", "yes"], ["2", "no"]]
    assert "Returned to baseline: round 0 yes at once; round 1 yes at once; round 2 no" in verdict.details


def test_without_thresholds_the_hypothesis_is_not_judged_but_the_effect_is_given():
    verdict, _ = _answer(_ctx({}))
    assert verdict.status == "untested"
    assert verdict.headline == "Not judged: the plan sets no thresholds (`metrics:`)"
    effect = next(d for d in verdict.details if d.startswith("At concurrency 8: E2E P95 "))
    # the Per step table's deltas: each round's step at 8 against its own baseline
    assert effect.startswith("At concurrency 8: E2E P95 +700.0, +702.5, +700.0 ms"), effect


def test_a_run_that_stopped_early_is_not_fully_tested():
    verdict, _ = _answer(_ctx({"p95_e2e_ms": 2000.0, "error_rate": 0.5}, stop_reason="wall clock 55 s"))
    assert verdict.status == "untested"
    assert verdict.headline.startswith("Not fully tested: the run stopped (wall clock 55 s)")


def test_a_breach_wins_over_everything_and_names_where_the_thresholds_held():
    verdict, _ = _answer(
        _ctx(stop_reason="error rate")
    )  # the synthetic plan's own limits: 950 ms breaks at 8
    assert verdict.status == "not-held"
    assert verdict.headline == (
        "The hypothesis did not hold: p95_e2e_ms 990.0 ms against its limit 950.0 ms, round 0 treatment at "
        "concurrency 8 (the first breach); the thresholds held up to concurrency 4"
    )


def test_every_format_opens_with_the_answer_and_ends_with_the_appendix():
    ctx = _ctx()
    md = render(ctx, "md")
    assert md.index("## Answer") < md.index("## Summary") < md.index("## Appendix") < md.index("### Plan")
    assert md.index("> **The hypothesis did not hold") < md.index("| change.variable | concurrency |")
    page = render(ctx, "html")
    assert page.index('id="verdict"') < page.index('<section id="summary">') < page.index('id="appendix"')
    assert (
        page.index('id="appendix"')
        < page.index('<section id="plan">')
        < page.index('<section id="environment">')
    )
    assert '<div class="verdict not-held" id="verdict"' in page
    data = json.loads(render(ctx, "json"))["sections"]["answer"]
    assert data["verdict"] == "not-held" and data["headline"].startswith("The hypothesis did not hold")
    assert data["key_chart"] == "E2E latency P95 per concurrency"


def test_the_itl_bookkeeping_qualifies_a_figure_after_the_summarys_figures():
    """The hypothesis gets its verdict in the answer; the summary opens with the run, its length and
    its requests, and how many inter-token gaps the ITL rests on comes after every other line."""
    doc = build_document(_ctx({"p95_e2e_ms": 2000.0, "error_rate": 0.5}))
    answer, summary = doc.sections[0], doc.sections[1]
    verdict = answer.blocks[0]
    assert isinstance(verdict, Verdict) and verdict.status == "held"
    assert verdict.headline.startswith("The hypothesis held:")
    assert verdict.details[0].startswith("Hypothesis: ")
    assert not [d for d in verdict.details if "ITL" in d]
    assert summary.id == "summary"
    items = [i for b in summary.blocks if isinstance(b, Bullets) for i in b.items]
    itl = [n for n, i in enumerate(items) if i.startswith("ITL ")]
    assert items[0].startswith("Run `7f3a91bc`") and items[2].startswith("315 requests, 5 errors")
    assert itl and itl == list(range(len(items) - len(itl), len(items))), items
    assert min(itl) >= 5, items


def _fig(name: str, predicted: float, measured: float | None, band: float = 0.5) -> Figure:
    return Figure(
        name,
        int(predicted * GIB),
        int((predicted - band) * GIB),
        int((predicted + band) * GIB),
        None if measured is None else int(measured * GIB),
        "test",
    )


def _row(step: int, overhead_measured: float | None, peak_predicted: float = 20.0) -> Row:
    figs = (
        _fig("resident_model", 10.0, 10.0),
        _fig("kv_cache", 8.0, 8.0),
        _fig("runtime_overhead", 2.0, overhead_measured),
        _fig("peak", peak_predicted, None if overhead_measured is None else 18.0 + overhead_measured),
    )
    return Row(0, "treatment", step, float(step), 0.0, 1.0, figs)


def test_plan_against_measured_folds_the_composition_windows():
    rows = folded_rows([_row(1, 1.0), _row(2, 2.0), _row(3, 2.25)])
    assert rows == [
        ["resident model", "10.00 (9.50–10.50)", "10.00", "+0.0%", "3 of 3"],
        ["KV cache (pool)", "8.00 (7.50–8.50)", "8.00", "+0.0%", "3 of 3"],
        # 1.0 is outside 1.5-2.5: in band in two windows of three; errors sorted low to high
        ["runtime overhead", "2.00 (1.50–2.50)", "1.00 to 2.25", "-11.1% to +100.0%", "2 of 3"],
        ["peak", "20.00 (19.50–20.50)", "19.00 to 20.25", "-1.2% to +5.3%", "2 of 3"],
    ]
    # a window with nothing measured is not counted; a prediction that moves is said to
    varied = folded_rows([_row(1, None, 20.0), _row(2, 2.0, 21.0)])
    assert varied[2] == ["runtime overhead", "2.00 (1.50–2.50)", "2.00", "+0.0%", "1 of 1"]
    assert varied[3][:2] == ["peak", "varies per window"]
