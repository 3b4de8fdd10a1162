"""Every headline sentence agrees with the table beside it, per report kind: experiment, incident
(the OOM drill), co-location and `vramlab plan`. The headline is read from the rendered document and
the figure from the rendered table, so a change to either side that breaks the agreement fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import _synthetic_run as synth
from _narrow import stand_in
from vramlab.report import load_context
from vramlab.report.blocks import Bullets, Table, Text, Verdict
from vramlab.report.sections import build_document
from vramlab.store import open_store

ROOT = Path(__file__).resolve().parents[1]


def _doc(store, run_id):
    return build_document(load_context(store, run_id))


def _section(doc, sid):
    return next(s for s in doc.sections if s.id == sid)


def _tables(section):
    return [b for b in section.blocks if isinstance(b, Table)]


def _bullets(section):
    return [i for b in section.blocks if isinstance(b, Bullets) for i in b.items]


def _texts(section):
    return [b.text for b in section.blocks if isinstance(b, Text)]


def _rows(table):
    return [dict(zip(table.headers, r, strict=True)) for r in table.rows]


# -- experiment --------------------------------------------------------------------------------------


def test_experiment_summary_agrees_with_thresholds_and_recovery_tables(tmp_path):
    with open_store(str(tmp_path / "v.db")) as store:
        synth.insert(store)
        doc = _doc(store, synth.RUN_ID)
    verdict = next(b for b in _section(doc, "answer").blocks if isinstance(b, Verdict))
    summary = verdict.details
    line = next(i for i in summary if i.startswith("Thresholds held"))
    m = re.search(
        r"up to: concurrency (\S+); first breach: round (\d+) (\w+) at concurrency (\S+), (\w+) (.+?) vs "
        r"limit (.+)$",
        line,
    )
    assert m, line
    held, rnd, phase, value, metric, seen, limit = m.groups()
    table = _tables(_section(doc, "thresholds"))[0]
    rows = _rows(table)
    col = next(h for h in table.headers if h.startswith(metric))
    first = next(
        r for r in rows if any(v.endswith("BREACH") for k, v in r.items() if k not in ("round", "phase"))
    )
    assert (first["round"], first["phase"], first["concurrency"]) == (rnd, phase, value)
    assert first[col] == f"{seen} BREACH" and f"≤ {limit}" in col
    ok_values = {
        float(r["concurrency"])
        for r in rows
        if r["concurrency"] != "–" and all(not v.endswith("BREACH") for v in r.values())
    }
    assert float(held) == max(v for v in ok_values if v < float(value))
    rec = _rows(_tables(_section(doc, "recovery"))[0])
    returned = next(i for i in summary if i.startswith("Returned to baseline: "))
    said = re.findall(r"round (\d+) (yes|no)(?: after (\S+) s| at once)?", returned)
    assert [r for r, _, _ in said] == [r["round"] for r in rec], returned
    for said_round, yes, after in said:
        row = next(r for r in rec if r["round"] == said_round)
        assert row["returned"] == yes
        if after:
            assert row["when (into recovery)"] == f"{after} s"
    # The verdict is the first breach the thresholds table shows, with the same figures.
    assert verdict.status == "not-held"
    assert verdict.headline.startswith(
        f"The hypothesis did not hold: {metric} {seen} against its limit {limit}"
    )
    assert f"round {rnd} {phase} at concurrency {value} (the first breach)" in verdict.headline


# -- incident and co-location (real drills against sims) ---------------------------------------------


@pytest.fixture(scope="module")
def drills(tmp_path_factory):
    from vramlab.demo.drill import run_drill_demo

    tmp = tmp_path_factory.mktemp("drills")
    db = str(tmp / "s.db")
    oom = run_drill_demo(db, tmp / "incident.html", baseline_s=1.5, step_s=0.6, observe_s=1.5)
    doc = yaml.safe_load((ROOT / "examples" / "colocation-drill.yaml").read_text())
    doc["target"]["sim"]["device"] = str(tmp / "gpu0.ledger")
    doc["baseline_s"], doc["ramp"]["step_s"] = 1.0, 0.5
    (tmp / "c.yaml").write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "drill", str(tmp / "c.yaml"), "--db", db, "-o", str(tmp / "c.md")],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    coloc = re.search(r"run ([0-9a-f]{8})", res.stderr).group(1)  # type: ignore[union-attr]
    store = open_store(db)
    yield store, oom.run_id, coloc, res.stdout
    store.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_incident_headline_clocks_are_the_recovery_tables(drills):
    store, run_id, _, _ = drills
    doc = _doc(store, run_id)
    head = _bullets(_section(doc, "incident"))[0].strip("*")
    clocks = {r["figure"]: r["value"] for r in _rows(_tables(_section(doc, "incident-recovery"))[0])}
    detected = re.search(r"detected (?:in )?(\S+ s)", head)
    assert detected and clocks["time to detect"] == detected.group(1), (head, clocks)
    rec = re.search(r"recovered in (\S+ s) from T0 \(the latest of: (.*?)\)", head)
    timeline_kinds = {r["event"] for r in _rows(_tables(_section(doc, "incident-timeline"))[0])}
    if rec is None:  # a busy machine can keep P95 above the baseline's for the whole observation window
        assert "NOT recovered" in head and clocks["time to recover"] == "–", (head, clocks)
        assert "recovered" not in timeline_kinds, (
            timeline_kinds
        )  # the timeline never says what the headline denies
        serving = re.search(r"serving again after (\S+ s)", head)
        assert serving is None or clocks["first successful generation"] == serving.group(1), (head, clocks)
    else:
        assert clocks["time to recover"] == rec.group(1)
        named = dict(re.findall(r"(serving again|health 200|P95 back) \+(\S+ s)", rec.group(2)))
        table_of = {
            "serving again": "first successful generation",
            "health 200": "health 200 again",
            "P95 back": "P95 back within tolerance",
        }
        assert named and all(clocks[table_of[k]] == v for k, v in named.items()), (named, clocks)
        assert max(float(v[:-2]) for v in named.values()) == float(rec.group(1)[:-2])  # the latest of them
    failed = re.search(r"(\d+) failed requests", head).group(1)  # type: ignore[union-attr]
    impact = {r["impact"]: r["value"] for r in _rows(_tables(_section(doc, "incident-impact"))[0])}
    assert impact["failed attempts"] == failed
    # One relative clock: each alert's "T0 +" is the timeline's for the same moment.
    timeline = _rows(_tables(_section(doc, "incident-timeline"))[0])
    det = _section(doc, "incident-detection")
    alerts = [t for t in _tables(det) if t.headers[0] == "alert"]
    for a in _rows(alerts[0]) if alerts else []:
        same = [r for r in timeline if r["event"] == "alert" and r["t (s)"] == a["t (s)"]]
        assert same and all(r["T0 + (s)"] == a["T0 + (s)"] for r in same), (a, same)
    firing = [a for a in (_rows(alerts[0]) if alerts else []) if a["state"] == "firing"]
    # time to alert is one of the firing rows' "T0 +" (the first still firing at T0, or after it); "–" only
    # when every firing came before T0 (and cleared)
    said = [rel if rel.startswith("-") else rel.lstrip("+") + " s" for rel in (a["T0 + (s)"] for a in firing)]
    if clocks["time to alert"] == "–":
        assert all(a["T0 + (s)"].startswith("-") for a in firing), (clocks, firing)
    else:
        assert any(clocks["time to alert"].startswith(x) for x in said), (clocks, firing)
    # The first abnormal signal named in the headline is the first row of the signal table.
    first = re.search(r"first abnormal signal (\S+);", head).group(1)  # type: ignore[union-attr]
    order = [t for t in _tables(det) if t.headers[0] == "signal"][0]
    assert order.rows[0][0] == first
    # A predicted limit at or above the failing value is called the unsafe side.
    cause = " ".join(_bullets(_section(doc, "incident-cause")))
    m = re.search(r"Predicted limit (\S+) .*? vs observed failure at (\S+) ", cause)
    if m:
        predicted, failed_at = (float(x.replace(",", "")) for x in m.groups())
        assert ("unsafe side" in cause) == (predicted >= failed_at), cause


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_drill_answer_is_the_incidents_own_figures(drills):
    """The answer box on the incident report's first screen: its failure mode, clocks, first signal
    and impact are the incident sections' (never a figure of its own)."""
    store, run_id, coloc, _ = drills
    doc = _doc(store, run_id)
    verdict = next(b for b in _section(doc, "answer").blocks if isinstance(b, Verdict))
    cause = _bullets(_section(doc, "incident-cause"))
    mode = next(c for c in cause if c.startswith("**Failure mode:**")).split("** ", 1)[1]
    clocks = {r["figure"]: r["value"] for r in _rows(_tables(_section(doc, "incident-recovery"))[0])}
    impact = {r["impact"]: r["value"] for r in _rows(_tables(_section(doc, "incident-impact"))[0])}
    head = _bullets(_section(doc, "incident"))[0].strip("*")
    assert verdict.headline.startswith(mode) and head.startswith(verdict.headline.split(";")[0])
    details = dict(d.split(": ", 1) for d in verdict.details if ": " in d)
    assert details["Failure mode"].startswith(f"`{mode}`")
    assert details["Time to detect"].startswith(f"{clocks['time to detect']} after T0")
    if clocks["time to recover"] == "–":
        assert verdict.status == "not-held" and "not recovered" in verdict.headline
    else:
        assert verdict.status == "recovered"
        assert verdict.headline.endswith(f"recovered in {clocks['time to recover']} from T0")
    assert details["Impact"].startswith(f"{impact['failed attempts']} failed requests")
    order = [t for t in _tables(_section(doc, "incident-detection")) if t.headers[0] == "signal"][0]
    assert details["First abnormal signal"].startswith(f"{order.rows[0][0]} = ")
    # the co-location drill whose added models were refused does not call itself held
    coloc_doc = _doc(store, coloc)
    coloc_verdict = next(b for b in _section(coloc_doc, "answer").blocks if isinstance(b, Verdict))
    refused = "did not start" in _bullets(_section(coloc_doc, "incident"))[0]
    assert (coloc_verdict.status == "not-held") == refused or coloc_verdict.status == "recovered"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_colocation_headline_counts_the_refusals_the_table_shows(drills):
    store, _, run_id, stdout = drills
    doc = _doc(store, run_id)
    head = _bullets(_section(doc, "incident"))[0].strip("*")
    table = _tables(_section(doc, "incident-colocation"))[0]
    col = table.headers.index("ramp and after")
    ramp = [r[col] for r in table.rows if r[col] != "–"]
    bad = [c for c in ramp if not c.startswith("started")]
    if bad:
        m = re.search(r"but (\d+) of (\d+) added models did not start", head)
        assert m and (int(m.group(1)), int(m.group(2))) == (len(bad), len(ramp)), (head, ramp)
    else:
        assert "did not start" not in head
    assert head.split(":")[0] in stdout  # the console says what the report says


def test_time_to_alert_reads_on_the_alert_tables_clock():

    from vramlab.report.incident_text import alert_clock

    early = stand_in(
        t0_s=10.0,
        time_to_alert_s=-0.47,  # signed, as the incident's JSON has it
        alerts=[{"name": "A", "state": "pending", "t_s": 9.0}, {"name": "A", "state": "firing", "t_s": 9.53}],
    )
    assert alert_clock(early).startswith("-0.47 s") and "before T0" in alert_clock(early)
    late = stand_in(t0_s=10.0, time_to_alert_s=1.25, alerts=[{"name": "A", "state": "firing", "t_s": 11.25}])
    assert alert_clock(late) == "1.25 s"
    assert alert_clock(stand_in(t0_s=10.0, time_to_alert_s=None, alerts=[])) == "–"


def test_predictions_above_the_failure_are_called_unsafe():
    from vramlab.report.incident_cause import prediction_side

    assert "unsafe side" in prediction_side(4432, 4096, 2048)
    assert "unsafe side" in prediction_side(4096, 4096, 2048)
    assert "safe side" in prediction_side(1500, 4096, 2048) and "unsafe" not in prediction_side(
        1500, 4096, 2048
    )
    assert "between" in prediction_side(3000, 4096, 2048)


# -- vramlab plan ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [
            "--model",
            "llama-3.1-8b-instruct",
            "--gpu",
            "rtx-4090",
            "--engine",
            "llama.cpp",
            "--ctx-size",
            "32768",
            "--parallel",
            "4",
        ],
        ["--model", "llama-3.1-8b-instruct", "--gpu", "h100-80gb", "--max-model-len", "8192"],
        ["--model", "qwen3-8b", "--gpu", "l4", "--engine", "sglang", "--max-model-len", "16384"],
    ],
)
def test_plan_safe_point_speaks_in_the_same_sequence_length_as_max_concurrency(args):
    out = subprocess.run(
        [sys.executable, "-m", "vramlab", "plan", *args, "--offline"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode in (0, 1, 3, 4), out.stderr  # any verdict; 2 and 70 are not
    conc = re.search(r"max concurrency at ([\d,]+) tokens: ([\d.]+)", out.stdout)
    safe = re.search(
        r"safe operating point .*?: (\d+|not one) (?:of \S+ slots|sequences?) at ([\d,]+) tokens", out.stdout
    )
    assert conc and safe, out.stdout
    assert safe.group(2) == conc.group(1), out.stdout  # one sequence length for both lines
    n = 0 if safe.group(1) == "not one" else int(safe.group(1))
    assert n <= int(float(conc.group(2))), out.stdout
    assert "1 sequences" not in out.stdout


def test_two_moments_printed_alike_print_the_same_t0_offset():
    """CI once printed two alert rows at t 7.63 s, one at T0 +0.37 and one at +0.38: each offset was
    rounded from the unrounded difference. The relative clock is the difference of the printed
    moments, and every duration from T0 (detect, alert, recover) reads on that same clock."""

    from vramlab.report.incident_text import alert_clock, from_t0, recovery_text, since_t0

    t0, a, b = 1.004, 1.376, 1.384  # a and b both print 1.38; a - t0 alone would round to 0.37
    assert f"{a:.2f}" == f"{b:.2f}" == "1.38"
    assert since_t0(a, t0) == since_t0(b, t0) == "+0.38"
    assert from_t0(a - t0, t0) == 0.38 and from_t0(None, t0) is None and from_t0(0.372, None) == 0.372
    assert alert_clock(stand_in(t0_s=t0, time_to_alert_s=a - t0, alerts=[])) == "0.38 s"
    from vramlab.analysis.aftermath import Recovery

    rec = Recovery(
        recovered=True,
        first_success_s=a - t0,
        health_failed=False,
        health_ok_s=None,
        p95_ok_s=a - t0,
        time_to_recover_s=a - t0,
    )
    assert (
        recovery_text(rec, t0)
        == "recovered in 0.38 s from T0 (the latest of: serving again +0.38 s, P95 back +0.38 s)"
    )


@given(t0=st.floats(0, 1e5), d=st.floats(-100, 1e4), e=st.floats(0, 0.0099))
def test_relative_clock_agrees_with_the_printed_moments(t0, d, e):
    from vramlab.report.incident_text import from_t0, since_t0

    t = t0 + d
    # a reader adds the printed offset to the printed T0 and lands on the printed moment
    assert abs(float(f"{t0:.2f}") + float(since_t0(t, t0)) - float(f"{t:.2f}")) < 0.005
    assert f"{from_t0(d, t0):+.2f}" == since_t0(t, t0)
    u = t + e  # a second moment that prints alike reads alike
    if f"{u:.2f}" == f"{t:.2f}":
        assert since_t0(u, t0) == since_t0(t, t0)


def test_timeline_calls_the_drills_serving_again_event_by_that_name_when_not_recovered(monkeypatch):
    """The drill emits `recovered` when the target serves again; the incident is recovered only when P95
    and health are back too. CI once showed the headline "NOT recovered" above a timeline row "recovered"."""
    from types import SimpleNamespace

    import vramlab.report.incident as rep
    from vramlab.records import EventRecord

    ev = EventRecord(
        run_id="r",
        t_s=12.0,
        kind="recovered",
        round=0,
        message="serving again 1.20 s after detection",
        data={},
    )
    for recovered in (False, True):
        rec = SimpleNamespace(
            recovered=recovered,
            first_success_s=1.5,
            health_failed=False,
            health_ok_s=None,
            p95_ok_s=2.0 if recovered else None,
            time_to_recover_s=2.0 if recovered else None,
        )
        inc = SimpleNamespace(t0_s=10.5, recovery=rec)
        monkeypatch.setattr(rep, "incident_of", lambda ctx, inc=inc: (inc, [inc]))
        table = rep.s_timeline(stand_in(events=[ev]))[1]
        assert isinstance(table, Table), table
        row = dict(zip(table.headers, table.rows[0], strict=True))
        if recovered:
            assert row["event"] == "recovered" and "recovered in 2.00 s from T0" in row["what"]
        else:
            assert row["event"] == "serving again" and "NOT recovered" in row["what"], row


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_incident_retry_storm_t0_and_recovery_sentences_quote_their_tables(drills):
    store, run_id, _, _ = drills
    doc = _doc(store, run_id)
    storm = {r["retry storm"]: r["value"] for r in _rows(_tables(_section(doc, "incident-storm"))[0])}
    amp = storm["amplification (attempt rate / baseline offered rate)"]
    lessons = " ".join(_bullets(_section(doc, "incident-lessons")))
    timeline = _rows(_tables(_section(doc, "incident-timeline"))[0])
    # one retry-storm figure: the lessons and any timeline row quote the table's, with its verdict
    said = re.findall(r"attempts (\S+×) the baseline's offered rate over the recovery window", lessons)
    if amp != "–":
        assert said == [amp], (said, amp, lessons)
        assert ("Recovery drew a retry storm" in lessons) == (storm["retry storm"] == "yes")
        assert ("No retry storm" in lessons) == (storm["retry storm"] == "no")
    for row in (r for r in timeline if r["event"] == "retry_storm"):
        assert f"retry storm: {storm['retry storm']} — attempts {amp}" in row["what"], (row, storm)
    # T0 is defined once: the timeline's words are the recovery table's
    rec = {r["figure"]: r for r in _rows(_tables(_section(doc, "incident-recovery"))[0])}
    t0_words = next(v for k, v in rec["T0"].items() if k not in ("figure", "value"))
    assert "first failed request" in t0_words and "fault step began" not in t0_words
    assert f"from T0 ({t0_words})" in " ".join(_texts(_section(doc, "incident-timeline")))
    # a restart that happened is never asked for: the action items follow the timeline
    actions = (
        " ".join(r[0] for r in _tables(_section(doc, "incident-actions"))[0].rows)
        if _tables(_section(doc, "incident-actions"))
        else ""
    )
    if any(r["event"] == "mitigation" for r in timeline):
        assert "restart the target on exit" not in actions
