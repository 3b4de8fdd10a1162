"""The demo: start a sim on a free loopback port, run a small plan against it with the ledger,
engine-metrics, host and health samplers, and render the stored run as HTML. Under a minute.

The plan is the packaged ``vramlab/data/examples/demo.yaml`` (examples/demo.yaml is a copy of it, and
`vramlab examples` writes it anywhere), so an installed package needs no examples directory; the
sim's URL and device file are filled in. The sim is stopped however the demo ends.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vramlab.experiment.plan import Plan, parse_plan
from vramlab.run.events import Event
from vramlab.run.runner import RunResult

SIM_ARGS = [
    "--model",
    "llama-3.1-8b-instruct",
    "--gpu",
    "h100-80gb",
    "--engine",
    "vllm",
    "--max-model-len",
    "4096",
    "--max-num-seqs",
    "8",
    "--speed",
    "10",
    "--seed",
    "7",
]


def demo_plan_text() -> str:
    """examples/demo.yaml, read from the installed package (the source of truth for the example)."""
    from importlib.resources import files

    return files("vramlab").joinpath("data/examples/demo.yaml").read_text()


@dataclass(frozen=True)
class DemoResult:
    result: RunResult
    store_url: str
    report_path: Path
    elapsed_s: float


def demo_plan(
    base_url: str,
    ledger: str,
    pid: int | None = None,
    rounds: int | None = None,
    duration_s: float | None = None,
    log_file: str | None = None,
) -> Plan:
    """The demo plan pointed at a running sim (a new document: the template is not edited)."""
    doc = parse_plan(demo_plan_text(), "demo.yaml").model_dump(mode="json")
    doc["target"]["base_url"] = base_url
    doc["target"]["log_file"] = log_file
    doc["target"]["pid"] = pid
    doc["samplers"]["ledger"] = ledger
    if rounds is not None:
        doc["rounds"] = rounds
    if duration_s is not None:
        doc["phases"]["duration_s"] = duration_s
    return Plan.model_validate(doc)


def run_demo(
    db: str | None,
    report_path: Path,
    subscribers: list[Callable[[Event], None]] | None = None,
    on_sim: Callable[[str], None] | None = None,
    rounds: int | None = None,
    duration_s: float | None = None,
) -> DemoResult:
    from vramlab.experiment.start import run_plan
    from vramlab.report import load_context, render
    from vramlab.sim.launch import start_sim
    from vramlab.store import open_store

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vramlab-demo-") as tmp:
        ledger = str(Path(tmp) / "sim-gpu0.ledger")
        sim = start_sim(SIM_ARGS, device=ledger, log_path=str(Path(tmp) / "sim.log"), timeout_s=30)
        try:
            if on_sim is not None:
                on_sim(sim.url)
            plan = demo_plan(
                sim.url, ledger, sim.pid, rounds, duration_s, log_file=str(Path(tmp) / "sim.log")
            )
            out = run_plan(
                plan,
                plan_dir=Path.cwd(),
                open_store=lambda: open_store(db),
                subscribers=subscribers or (),
            )
        finally:
            sim.stop()
    with open_store(db) as store:
        text = render(load_context(store, out.result.run_id), "html")
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text, encoding="utf-8")
    return DemoResult(out.result, out.store_url, report_path, time.monotonic() - t0)
