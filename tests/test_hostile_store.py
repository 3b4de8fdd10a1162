"""The installed CLI on a store with one corrupt row, and on outputs that refuse what it writes.

A store is a file anyone can edit, and a database that outlived a bug can hold rows the record
contract refuses. One such row is reported as that row and the rest still render: `report` (every
format), `runs --json`, `compare` and `calibrate RUN` never exit 70 on it; they print what they
could and say, in one line, which rows they left out (exit 1). `calibrate RUN` checks the stored
figures as strictly as `calibrate LOG` checks a log's: an absurd figure is left out with a note,
never fitted.

The store is a real one: `vramlab demo --no-drill` writes it once for the module (a sim, a run with
its capacity plan, start-up log figures and ledger samples), and each case corrupts a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
VRAMLAB = str(Path(sys.executable).with_name("vramlab"))


def _vramlab(*args: str, cwd: Path, stdout: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VRAMLAB_DB", "VRAMLAB_DEBUG")}
    return subprocess.run(
        [VRAMLAB, *args],
        cwd=cwd,
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=180,
        env={**env, "HF_HUB_OFFLINE": "1"},
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from vramlab.demo.experiment import run_demo

    tmp = tmp_path_factory.mktemp("hostile-store")
    # the demo's own plan, sim and samplers, one short round: every kind of row the cases corrupt
    # (`vramlab demo`'s three rounds took 26 s here; the command has its own test)
    run_demo(str(tmp / "demo.db"), tmp / "d.html", rounds=1, duration_s=1.0)
    con = sqlite3.connect(tmp / "demo.db")
    (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
    con.close()
    return tmp / "demo.db", run_id


R = "run_id = '{R}'"
FIRST = "seq = (SELECT min(seq) FROM {t} WHERE run_id = '{R}'{extra})"
# case -> (SQL that corrupts one row or field, what the one warning line names)
CORRUPT: dict[str, tuple[str, str]] = {
    "plan-null": (f"UPDATE runs SET plan = 'null' WHERE {R}", "plan"),
    "plan-not-json": (f"UPDATE runs SET plan = '{{oops' WHERE {R}", "plan is not JSON"),
    "target-not-json": (f"UPDATE runs SET target = 'not json' WHERE {R}", "target is not JSON"),
    "notes-an-object": (f"UPDATE runs SET notes = '{{\"a\": 1}}' WHERE {R}", "notes"),
    "started-at-text": (f"UPDATE runs SET started_at = 'yesterday' WHERE {R}", "started_at"),
    "status-unknown": (f"UPDATE runs SET status = 'weird' WHERE {R}", "status"),
    "event-data-not-json": (
        "UPDATE events SET data = 'not json' WHERE "
        + FIRST.format(t="events", R="{R}", extra=" AND kind = 'phase_end'"),
        "data is not JSON",
    ),
    "event-data-null": (f"UPDATE events SET data = 'null' WHERE {R} AND kind = 'startup_memory'", "data"),
    "event-data-a-list": (f"UPDATE events SET data = '[1]' WHERE {R} AND kind = 'capacity_plan'", "data"),
    "event-field-wrong-type": (
        f"UPDATE events SET data = json_set(data, '$.facts', 'x') WHERE {R} AND kind = 'capacity_plan'",
        "data.facts",
    ),
    "event-time-text": (
        "UPDATE events SET t_s = 'x' WHERE " + FIRST.format(t="events", R="{R}", extra=""),
        "t_s",
    ),
    "ledger-value-text": (
        "UPDATE samples SET value = 'abc' WHERE "
        + FIRST.format(t="samples", R="{R}", extra=" AND source = 'ledger'"),
        "value",
    ),
    "sample-value-infinite": (
        "UPDATE samples SET value = 9e999 WHERE " + FIRST.format(t="samples", R="{R}", extra=""),
        "not a finite number",
    ),
    "sample-labels-not-json": (
        "UPDATE samples SET labels = 'x' WHERE " + FIRST.format(t="samples", R="{R}", extra=""),
        "labels is not JSON",
    ),
    "request-itl-not-json": (
        "UPDATE requests SET itl_ms = 'x' WHERE " + FIRST.format(t="requests", R="{R}", extra=""),
        "itl_ms is not JSON",
    ),
    "request-e2e-text": (
        "UPDATE requests SET e2e_ms = 'fast' WHERE " + FIRST.format(t="requests", R="{R}", extra=""),
        "e2e_ms",
    ),
}


def _corrupt(demo: tuple[Path, str], tmp: Path, sql: str) -> tuple[Path, str]:
    src, run_id = demo
    db = tmp / "c.db"
    shutil.copy(src, db)
    con = sqlite3.connect(db)
    con.execute(sql.replace("{R}", run_id))
    con.commit()
    con.close()
    return db, run_id


def _one_warning(res: subprocess.CompletedProcess[str], says: str) -> None:
    assert "Traceback" not in res.stderr and res.returncode != 70, res.stderr[-1500:]
    lines = [line for line in res.stderr.splitlines() if line.strip() and not line.startswith("wrote ")]
    assert res.returncode == 1 and len(lines) == 1, (res.returncode, res.stderr[-1500:])
    assert says in lines[0] and "could not" in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_one_corrupt_row_is_named_and_the_rest_renders(
    demo: tuple[Path, str], tmp_path: Path, case: str
) -> None:
    sql, says = CORRUPT[case]
    db, run_id = _corrupt(demo, tmp_path, sql)
    res = _vramlab("report", run_id, "--db", str(db), "--format", "md", cwd=tmp_path)
    _one_warning(res, says)
    assert f"vramlab experiment {run_id}" in res.stdout and "## " in res.stdout  # the rest rendered
    assert "could not be read" in res.stdout  # the report itself says what it left out
    html = _vramlab("report", run_id, "--db", str(db), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    _one_warning(html, says)
    assert "<svg" in (tmp_path / "r.html").read_text()
    runs = _vramlab("runs", "--json", "--db", str(db), cwd=tmp_path)
    assert runs.returncode in (0, 1) and "Traceback" not in runs.stderr, runs.stderr
    assert [r["id"] for r in json.loads(runs.stdout)] == [run_id]
    cal = _vramlab("calibrate", run_id, "--db", str(db), cwd=tmp_path)
    assert cal.returncode in (0, 1) and "Traceback" not in cal.stderr, cal.stderr[-1500:]
    if cal.returncode == 1 and "no constant was fitted" not in cal.stderr:
        assert "could not be read" in cal.stderr, cal.stderr  # the run is refused for its corrupt rows


def test_a_run_of_an_unknown_kind_is_that_runs_problem(demo: tuple[Path, str], tmp_path: Path) -> None:
    """Its own row cannot be read: `report` says so (exit 1), `runs` lists the others and names it."""
    src, run_id = demo
    db = tmp_path / "k.db"
    shutil.copy(src, db)
    con = sqlite3.connect(db)
    row = con.execute("SELECT * FROM runs").fetchone()
    con.execute(f"INSERT INTO runs VALUES ({', '.join('?' * len(row))})", ("0badc0de", "bogus", *row[2:]))
    con.commit()
    con.close()
    res = _vramlab("report", "0badc0de", "--db", str(db), cwd=tmp_path)
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert "0badc0de cannot be read" in res.stderr and "kind" in res.stderr
    runs = _vramlab("runs", "--json", "--db", str(db), cwd=tmp_path)
    _one_warning(runs, "run 0badc0de")
    assert [r["id"] for r in json.loads(runs.stdout)] == [run_id]


# -- calibrate RUN: stored figures checked like a log's -----------------------------------------------
LEDGER = "UPDATE samples SET value = {v} WHERE {R} AND source = 'ledger' AND name LIKE '%memory%bytes'"
STARTUP = "UPDATE events SET data = json_set(data, '$.observation.weights_bytes', {v}) WHERE {R} AND kind = 'startup_memory'"


@pytest.mark.parametrize(
    "sql, says",
    [
        (LEDGER.replace("{v}", "1e30").replace("{R}", R), "bigger than the card"),
        (STARTUP.replace("{v}", "1e30").replace("{R}", R), "weights_bytes"),
        (STARTUP.replace("{v}", "1").replace("{R}", R), "smaller than any buffer"),
        (STARTUP.replace("{v}", "json('true')").replace("{R}", R), "weights_bytes is True"),
        (STARTUP.replace("{v}", str(-(1 << 30))).replace("{R}", R), "negative"),
    ],
    ids=["ledger-1e30", "weights-1e30", "weights-1-byte", "weights-true", "weights-minus-1-gib"],
)
def test_calibrate_leaves_absurd_stored_figures_out_of_the_fit(
    demo: tuple[Path, str], tmp_path: Path, sql: str, says: str
) -> None:
    db, run_id = _corrupt(demo, tmp_path, sql)
    res = _vramlab("calibrate", run_id, "--db", str(db), "--json", cwd=tmp_path)
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr[-1500:]
    notes = [line for line in res.stderr.splitlines() if "note:" in line]
    assert notes and any(says in n for n in notes), res.stderr
    out = json.loads(res.stdout)
    assert out["left_out"]
    for change in out.get("changed", []):  # whatever was fitted stayed within a card's size
        assert abs(change["value"]) < (1 << 40), change


def test_calibrate_refuses_an_unwritable_profile_before_the_fit(
    demo: tuple[Path, str], tmp_path: Path
) -> None:
    src, run_id = demo
    (tmp_path / "adir").mkdir()
    for out, says in [
        ("/proc/nope/p.toml", "does not exist"),
        (str(tmp_path / "adir"), "is a folder"),
        ("/dev/full", "not a regular file"),
        (str(tmp_path / ("p" * 300 + ".toml")), "too long"),
    ]:
        res = _vramlab("calibrate", run_id, "--db", str(src), "-o", out, cwd=tmp_path)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, (out, res.stderr)
        assert says in res.stderr and not res.stdout, (out, res.stderr)
    res = _vramlab("calibrate", "a" * 300, cwd=tmp_path)
    assert res.returncode == 2 and "longer than the file system allows" in res.stderr, res.stderr


# -- outputs that refuse, terminals that would obey ---------------------------------------------------
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", "llama-3.1-8b-instruct", "--gpu", "h100-80gb", "--json"],
        ["models"],
        ["runs", "--json", "--db", "{db}"],
        ["report", "{run}", "--db", "{db}"],
    ],
    ids=["plan-json", "models", "runs-json", "report"],
)
def test_stdout_on_a_full_disk_is_one_line_and_exit_1(
    demo: tuple[Path, str], tmp_path: Path, argv: list[str]
) -> None:
    db, run_id = demo
    args = [a.replace("{db}", str(db)).replace("{run}", run_id) for a in argv]
    with open("/dev/full", "w") as full:
        res = _vramlab(*args, cwd=tmp_path, stdout=full.fileno())
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1 and "cannot write to standard output: No space left" in res.stderr


def test_control_characters_in_a_stored_name_never_reach_the_terminal(
    demo: tuple[Path, str], tmp_path: Path
) -> None:
    db, run_id = _corrupt(
        demo,
        tmp_path,
        "UPDATE runs SET name = 'evil\x1b]0;owned\x07\x1b[2J', "
        "fixed = json_set(fixed, '$.model', 'm\x1b[31mred') WHERE " + R,
    )
    for args in (["report", run_id, "--format", "md"], ["runs"], ["report", run_id, "--format", "json"]):
        res = _vramlab(*args, "--db", str(db), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout and "\x07" not in res.stdout, args
    md = _vramlab("report", run_id, "--format", "md", "--db", str(db), cwd=tmp_path).stdout
    assert "evil\\x1b]0;owned\\x07" in md  # shown, not obeyed
