"""The OOM drill `vramlab demo` runs after its experiment: examples/oom-drill.yaml (a copy of
the packaged ``vramlab/data/examples/oom-drill.yaml``, so an installed package needs no examples directory) against a sim
the drill starts itself on a free loopback port, with its ledger in a temporary directory. The
incident report is rendered from the store as HTML. The rollback runs however the drill ends.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramlab.drill.plan import DrillPlan, parse_plan


def oom_drill_plan_text() -> str:
    """examples/oom-drill.yaml, read from the installed package (the source of truth; examples/ holds a copy)."""
    from importlib.resources import files

    return files("vramlab").joinpath("data/examples/oom-drill.yaml").read_text()


@dataclass(frozen=True)
class DrillDemoResult:
    run_id: str
    status: str  # completed | stopped | failed | interrupted
    exit_code: int  # the one exit-code policy (run/runner.py), with the report's recovery verdict
    summary: str  # the incident's one-line summary (failure mode, detection, recovery)
    report_path: Path
    elapsed_s: float


def demo_drill_plan(
    device: str, baseline_s: float | None = None, step_s: float | None = None, observe_s: float | None = None
) -> DrillPlan:
    """The example drill with its sim on *device* (a new document: the template is not edited).
    The windows can be shortened (tests); the port is left to the drill (a free one)."""
    import yaml

    doc = yaml.safe_load(oom_drill_plan_text())
    doc["target"]["sim"]["device"] = device
    if baseline_s is not None:
        doc["baseline_s"] = baseline_s
    if step_s is not None:
        doc["ramp"]["step_s"] = step_s
    if observe_s is not None:
        doc["recovery"]["observe_s"] = observe_s
    return parse_plan(doc, "oom-drill.yaml")


def run_drill_demo(
    db: str | None,
    report_path: Path,
    subscribers: list[Callable[[Any], None]] | None = None,
    on_run: Callable[[str], None] | None = None,
    **windows: float,
) -> DrillDemoResult:
    """Run the example OOM drill against its own sim; write the incident report (HTML) to *report_path*."""
    from vramlab.drill.start import run_drill
    from vramlab.report import load_context, render
    from vramlab.report.incident import summary_line
    from vramlab.report.verdict import recovery_verdict
    from vramlab.store import open_store

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vramlab-demo-drill-") as tmp, open_store(db) as store:
        plan = demo_drill_plan(str(Path(tmp) / "sim-gpu0.ledger"), **windows)
        out = run_drill(plan, store, workdir=tmp, subscribers=subscribers or (), on_run=on_run)
        ctx = load_context(store, out.run_id)
        text = render(ctx, "html")
        summary = summary_line(ctx)
        code = out.session.exit_code(recovered=not recovery_verdict(ctx, out.unrecovered_rounds))
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text, encoding="utf-8")
    return DrillDemoResult(out.run_id, out.status, code, summary, report_path, time.monotonic() - t0)


__all__ = ["oom_drill_plan_text", "DrillDemoResult", "demo_drill_plan", "run_drill_demo"]
