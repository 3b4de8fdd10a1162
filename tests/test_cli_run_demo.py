"""The demo against a real `vramlab sim` subprocess, shortened; and the CLI's help."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from vramlab.experiment.demo import DEMO_PLAN, demo_plan, run_demo
from vramlab.experiment.plan import load_plan
from vramlab.store import open_store

ROOT = Path(__file__).resolve().parents[1]


def test_example_file_is_the_demo_plan() -> None:
    assert (ROOT / "examples" / "demo.yaml").read_text() == DEMO_PLAN
    plan = demo_plan("http://127.0.0.1:1234", "/tmp/x.ledger")
    assert plan.target.base_url == "http://127.0.0.1:1234" and plan.samplers.ledger == "/tmp/x.ledger"
    assert plan.rounds == 3 and plan.wall_clock_s() < 60
    assert load_plan(ROOT / "examples" / "demo.yaml").change.values() == plan.change.values()


def test_demo_runs_against_the_sim_and_writes_a_report(tmp_path: Path) -> None:
    urls: list[str] = []
    res = run_demo(str(tmp_path / "v.db"), tmp_path / "out" / "demo.html", on_sim=urls.append,
                   rounds=1, duration_s=0.5)
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
        p = subprocess.run([sys.executable, "-m", "vramlab", cmd, "--help"], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and "usage: vramlab " + cmd in p.stdout
    p = subprocess.run([sys.executable, "-m", "vramlab", "run", "--help"], capture_output=True, text=True, timeout=30)
    assert "130 interrupted" in p.stdout


def test_engine_kv_usage_from_the_sim_fires_a_stop_and_rollback_runs(tmp_path: Path) -> None:
    from vramlab.experiment.demo import SIM_ARGS
    from vramlab.experiment.plan import Plan
    from vramlab.experiment.session import run_plan
    from vramlab.sim.launch import start_sim

    marker = tmp_path / "rolled"
    sim = start_sim(SIM_ARGS, device=str(tmp_path / "gpu0.ledger"), timeout_s=30)
    try:
        doc = demo_plan(sim.url, str(tmp_path / "gpu0.ledger"), sim.pid, rounds=1, duration_s=3).model_dump(mode="json")
        doc["stop_conditions"] = {"kv_usage": 0.001, "wall_clock_s": 20}
        doc["samplers"]["interval_s"] = 0.2
        doc["rollback"] = [{"run": f"echo $VRAMLAB_RUN_STATUS > {marker}"}]
        out = run_plan(Plan.model_validate(doc), plan_dir=tmp_path, db=str(tmp_path / "v.db"))
    finally:
        sim.stop()
    r = out.result
    assert r.status == "stopped" and r.exit_code == 3
    assert r.stop_reason is not None and r.stop_reason.condition == "kv_usage"
    assert marker.read_text().strip() == "stopped"
