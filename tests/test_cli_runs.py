"""`vramlab runs`, `report` and `compare` as a user runs them: the installed command, a real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import _synthetic_run as synth
from _narrow import some
from vramlab.store import open_store

VRAMLAB = [str(Path(sys.executable).with_name("vramlab"))]


def vramlab(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "VRAMLAB_DB"} | (env or {})
    return subprocess.run(
        VRAMLAB + list(args), capture_output=True, text=True, timeout=60, cwd=cwd, env=full_env
    )


@pytest.fixture
def db(tmp_path) -> str:
    url = str(tmp_path / "runs.db")
    with open_store(url) as store:
        synth.insert(store, "7f3a91bc", started_at=1_760_000_000.0)
        synth.insert(store, "91bc0000", started_at=1_760_000_500.0)
        synth.insert(store, "7f3b0000", started_at=1_760_000_100.0, model="qwen2.5-7b-instruct")
        synth.insert(store, "0d0d0d0d", started_at=1_760_000_900.0, status="running")
        store.update_run("0d0d0d0d", kind="drill")
    return url


def test_runs_json_newest_first(db):
    res = vramlab("runs", "--json", "--db", db)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["id"] for r in rows] == ["0d0d0d0d", "91bc0000", "7f3b0000", "7f3a91bc"]
    assert rows[0]["kind"] == "drill" and rows[1]["kind"] == "run" and rows[0]["stored_status"] == "running"
    assert rows[0]["status"] == "died"  # stored as running in 2025, no heartbeat since: its process is gone
    assert rows[1]["started_at"] == 1_760_000_500.0 and rows[1]["name"] == "concurrency-ramp"
    assert [r["id"] for r in json.loads(vramlab("runs", "--json", "--kind", "drill", "--db", db).stdout)] == [
        "0d0d0d0d"
    ]
    limited = vramlab("runs", "--limit", "2", "--db", db)
    lines = limited.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["ID", "KIND", "STATUS"] and len(lines) == 3
    assert lines[1].startswith("0d0d0d0d  drill  died")


def test_runs_uses_vramlab_db_then_cwd_default(tmp_path, db):
    assert json.loads(vramlab("runs", "--json", env={"VRAMLAB_DB": db}).stdout)[0]["id"] == "0d0d0d0d"
    (tmp_path / "elsewhere").mkdir()
    res = vramlab("runs", cwd=tmp_path / "elsewhere")
    assert res.returncode == 0 and "no runs stored yet" in res.stdout
    assert (tmp_path / "elsewhere" / "vramlab.db").exists()


def test_report_html_to_file(db, tmp_path):
    out = tmp_path / "out" / "report.html"
    missing = vramlab("report", "7f3a", "-o", str(out), "--db", db)  # a folder that is not there: refused
    assert missing.returncode == 2 and "does not exist" in missing.stderr and not out.parent.exists()
    out.parent.mkdir()
    res = vramlab("report", "7f3a", "-o", str(out), "--db", db)
    assert res.returncode == 0, res.stderr
    assert f"wrote {out} (html, run 7f3a91bc)" in res.stderr and res.stdout == ""
    page = out.read_text()
    HTMLParser().feed(page)
    assert page.count("<svg") == 4 and "992.5" in page


def test_report_markdown_and_json_to_stdout(db):
    md = vramlab("report", "91bc", "--db", db)
    assert md.returncode == 0 and md.stdout.startswith("# vramlab experiment 91bc0000: concurrency-ramp")
    data = json.loads(vramlab("report", "0d0d", "--format", "json", "--db", db).stdout)
    assert data["run"]["kind"] == "drill" and data["complete"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "7f"], "run id prefix '7f' is ambiguous: 7f3a91bc, 7f3b0000; give more characters"),
        (["report", "abcdef12"], "no run 'abcdef12'"),
        (["report", "not-hex"], "run ids are hex"),
        (["compare", "7f3a", "eeee"], "no run 'eeee'"),
    ],
)
def test_bad_ids_are_one_line_errors(db, args, message):
    res = vramlab(*args, "--db", db)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"vramlab {args[0]}: error: ")
    assert message in res.stderr and "Traceback" not in res.stderr and res.stdout == ""


def test_bad_db_is_one_line_error(tmp_path):
    res = vramlab("runs", "--db", "mysql://x/y")
    assert res.returncode == 2 and "unsupported store URL scheme 'mysql'" in res.stderr
    res = vramlab("runs", "--db", "postgresql://u:topsecret@127.0.0.1:1/x")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "cannot open the store" in res.stderr and "topsecret" not in res.stderr


def test_compare_refuses_different_fixed_parts_unless_forced(db):
    res = vramlab("compare", "7f3a", "7f3b", "--db", db)
    assert res.returncode == 2 and res.stdout == ""
    assert (
        "differ in their fixed parts (model 'llama-3.1-8b-instruct' vs 'qwen2.5-7b-instruct')" in res.stderr
    )
    forced = vramlab("compare", "7f3a", "7f3b", "--force", "--db", db)
    assert forced.returncode == 0 and "warning: fixed parts differ" in forced.stderr
    assert "e2e_p95_ms" in forced.stdout


def test_compare_deltas(db, tmp_path):
    # a second run of the same plan where the concurrency-8 step got slower by 100 ms
    with open_store(db) as store:
        run, reqs, samples, events = synth.build("abab0000", started_at=1_760_002_000.0)
        reqs = [
            r.model_copy(update={"e2e_ms": some(r.e2e_ms) + 100}) if r.step_value == 8.0 else r for r in reqs
        ]
        store.create_run(run)
        store.add_requests(run.run_id, reqs)
        store.add_samples(run.run_id, samples)
        store.add_events(run.run_id, events)
    res = vramlab("compare", "7f3a", "abab", "--json", "--db", db)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["comparable"] is True and data["differences"] == []
    by = {(d["phase"], d["step"], d["metric"]): d for d in data["deltas"]}
    d8 = by[("treatment", "8", "e2e_p95_ms")]
    assert (d8["a"], d8["b"], d8["delta"]) == (990.0, 1090.0, 100.0)  # medians over rounds
    assert by[("treatment", "4", "e2e_p95_ms")]["delta"] == 0.0
    text = vramlab("compare", "7f3a", "abab", "--db", db).stdout
    line = next(
        x for x in text.splitlines() if x.startswith("treatment") and " 8 " in x and "e2e_p95_ms" in x
    )
    assert line.split()[-2:] == ["+100.00", "+10.1%"]


@pytest.mark.slow
def test_report_from_either_backend(store_url, tmp_path):
    with open_store(store_url) as store:
        synth.insert(store)
    res = vramlab("report", "7f3a91bc", "--format", "json", "--db", store_url)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["phases"][0]["requests"]["e2e"]["p50"] == 200.0
