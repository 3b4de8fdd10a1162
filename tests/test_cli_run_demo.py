"""The demo against a real `vramlab sim` subprocess, shortened: the experiment, then the OOM drill
and its incident report; and the CLI's help."""

from __future__ import annotations

import functools
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from vramlab.demo.experiment import demo_plan, demo_plan_text, run_demo
from vramlab.experiment.plan import load_plan
from vramlab.store import open_store

ROOT = Path(__file__).resolve().parents[1]


def test_example_file_is_the_demo_plan() -> None:
    # the packaged file is the source of truth (examples/ is a copy of it; test_docs_and_layers checks
    # they agree), so `demo` works from an installed package
    assert not (ROOT / "examples" / "demo.yaml").is_symlink()
    assert (ROOT / "examples" / "demo.yaml").read_text() == demo_plan_text()
    plan = demo_plan("http://127.0.0.1:1234", "/tmp/x.ledger")
    assert plan.target.base_url == "http://127.0.0.1:1234" and plan.samplers.ledger == "/tmp/x.ledger"
    assert plan.rounds == 3 and plan.wall_clock_s() < 60
    assert load_plan(ROOT / "examples" / "demo.yaml").change.values() == plan.change.values()


def test_example_drill_is_the_demo_drill_plan() -> None:
    from vramlab.demo.drill import demo_drill_plan, oom_drill_plan_text
    from vramlab.drill.plan import load_plan as load_drill_plan

    assert (
        ROOT / "examples" / "oom-drill.yaml"
    ).read_text() == oom_drill_plan_text()  # `demo` needs no examples dir
    plan = demo_drill_plan("/tmp/x/sim-gpu0.ledger")
    assert plan.target.sim is not None and plan.target.sim.device == "/tmp/x/sim-gpu0.ledger"
    assert plan.target.base_url is None  # the drill picks a free port for its own sim
    assert plan.target.environment == "test"
    example = load_drill_plan(ROOT / "examples" / "oom-drill.yaml")
    assert plan.model_dump(exclude={"target"}) == example.model_dump(exclude={"target"})


def _shortened(monkeypatch) -> None:
    """The demo's own code paths with shorter windows (the full demo takes ~40 s)."""
    import vramlab.demo.drill
    import vramlab.demo.experiment

    monkeypatch.setattr(
        vramlab.demo.experiment,
        "run_demo",
        functools.partial(vramlab.demo.experiment.run_demo, rounds=1, duration_s=0.5),
    )
    monkeypatch.setattr(
        vramlab.demo.drill,
        "run_drill_demo",
        functools.partial(vramlab.demo.drill.run_drill_demo, baseline_s=1.0, step_s=0.7, observe_s=2.0),
    )


def test_demo_cli_runs_the_experiment_then_the_oom_drill(tmp_path: Path, monkeypatch, capsys) -> None:
    from vramlab.cli.main import main

    _shortened(monkeypatch)
    monkeypatch.chdir(tmp_path)
    code = main(["demo", "--db", str(tmp_path / "v.db")])
    out = capsys.readouterr().out
    assert code == 0, out
    demo_html, incident_html = tmp_path / "vramlab-demo.html", tmp_path / "vramlab-incident.html"
    assert f"report:          {demo_html}" in out and f"incident report: {incident_html}" in out
    text = incident_html.read_text()
    assert text.lstrip().lower().startswith("<!doctype html")
    # the incident report names how the service failed and how long it took to serve again
    assert re.search(r"crash_after_oom at \d+ prompt tokens", text), text[:2000]
    recovered = re.search(r"recovered in \d+(\.\d+)? s", text) is not None
    if not recovered:  # a busy machine can keep P95 above the baseline's for the whole observation window
        assert "NOT recovered" in text and re.search(r"serving again after \d+(\.\d+)? s", text), text[:2000]
    assert "time to recover" in text.lower()
    drill_id = re.search(r"drill run ([0-9a-f]{8})", out).group(1)  # type: ignore[union-attr]
    with open_store(str(tmp_path / "v.db")) as store:
        runs = {r.run_id: r for r in store.list_runs()}
        assert runs[drill_id].kind == "drill" and runs[drill_id].status == "completed"
        assert (
            len(runs) == 2 and [r.kind for r in runs.values()].count("drill") == 1
        )  # the experiment, the drill
        kinds = [e.kind for e in store.events(drill_id)]
        assert {"fault", "detect", "mitigation", "recovered", "rollback"} <= set(
            kinds
        )  # "recovered": serving again
    assert not list(tmp_path.glob("*.ledger"))  # the drill's card lived in a temp dir


def test_demo_no_drill_skips_the_drill(tmp_path: Path, monkeypatch, capsys) -> None:
    import vramlab.demo.drill
    from vramlab.cli.main import main

    _shortened(monkeypatch)

    def must_not_run(*a, **k):
        raise AssertionError("--no-drill ran the drill")

    monkeypatch.setattr(vramlab.demo.drill, "run_drill_demo", must_not_run)
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--no-drill", "--db", str(tmp_path / "v.db")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "vramlab-demo.html").exists() and not (tmp_path / "vramlab-incident.html").exists()
    assert "incident report" not in out


def test_demo_runs_against_the_sim_and_writes_a_report(tmp_path: Path) -> None:
    urls: list[str] = []
    res = run_demo(
        str(tmp_path / "v.db"), tmp_path / "out" / "demo.html", on_sim=urls.append, rounds=1, duration_s=0.5
    )
    assert res.result.status == "completed" and res.result.errors == 0 and res.result.requests > 10
    html = res.report_path.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and res.result.run_id in html
    with open_store(str(tmp_path / "v.db")) as store:
        sources = {s.source for s in store.samples(res.result.run_id)}
        assert {"ledger", "engine", "host", "health"} <= sources
        run = store.get_run(res.result.run_id)
        assert run.fixed["engine_version"] and not [n for n in run.notes if n.startswith("sampler")]
    port = urlparse(urls[0]).port
    with socket.socket() as s:  # the sim was stopped
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_run_and_demo_have_help() -> None:
    for cmd in ("run", "demo"):
        p = subprocess.run(
            [sys.executable, "-m", "vramlab", cmd, "--help"], capture_output=True, text=True, timeout=30
        )
        assert p.returncode == 0 and "usage: vramlab " + cmd in p.stdout
    p = subprocess.run(
        [sys.executable, "-m", "vramlab", "run", "--help"], capture_output=True, text=True, timeout=30
    )
    assert "130 interrupted" in p.stdout


def test_engine_kv_usage_from_the_sim_fires_a_stop_and_rollback_runs(tmp_path: Path) -> None:
    from vramlab.demo.experiment import SIM_ARGS
    from vramlab.experiment.plan import Plan
    from vramlab.experiment.start import run_plan
    from vramlab.sim.launch import start_sim

    marker = tmp_path / "rolled"
    sim = start_sim(SIM_ARGS, device=str(tmp_path / "gpu0.ledger"), timeout_s=30)
    try:
        doc = demo_plan(sim.url, str(tmp_path / "gpu0.ledger"), sim.pid, rounds=1, duration_s=3).model_dump(
            mode="json"
        )
        doc["stop_conditions"] = {"kv_usage": 0.001, "wall_clock_s": 20}
        doc["samplers"]["interval_s"] = 0.2
        doc["rollback"] = [{"run": f"echo $VRAMLAB_RUN_STATUS > {marker}"}]
        out = run_plan(
            Plan.model_validate(doc), plan_dir=tmp_path, open_store=lambda: open_store(str(tmp_path / "v.db"))
        )
    finally:
        sim.stop()
    r = out.result
    assert r.status == "stopped" and r.exit_code == 3
    assert r.stop_reason is not None and r.stop_reason.condition == "kv_usage"
    assert marker.read_text().strip() == "stopped"
