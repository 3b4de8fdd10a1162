"""The OOM drill `vramlab demo` runs after its experiment: examples/oom-drill.yaml (kept identical to
``OOM_DRILL_PLAN`` by a test, so an installed package needs no examples directory) against a sim
the drill starts itself on a free loopback port, with its ledger in a temporary directory. The
incident report is rendered from the store as HTML. The rollback runs however the drill ends.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramlab.drill.plan import DrillPlan, parse_plan

OOM_DRILL_PLAN = """\
# An OOM drill against the rehearsal server: ramp the prompt length step by step until the
# simulated card runs out of memory, recover, and write the incident report.
#   vramlab drill examples/oom-drill.yaml
#   vramlab alerts examples/oom-drill.yaml > rules.yml && promtool check rules rules.yml
name: oom-drill
description: >
  Context-length ramp on a small model on an L4 until the engine runs out of memory.
  Question: is the OOM detectable, and does it recover cleanly without a retry storm?
rounds: 1
baseline_s: 2

target:
  kind: sim                 # the drill starts `vramlab sim serve` with these settings
  environment: test         # a drill refuses anything else without the override flag
  engine: sglang
  sim:
    model: qwen2.5-1.5b-instruct
    gpu: l4
    engine: sglang           # sizes its KV pool from free memory, so a restart fits next to a co-tenant
    gpu_memory_utilization: 0.9
    max_model_len: 32768
    speed: 200
    watchdog_s: 0.5         # vLLM exits ~5 s after engine death; shortened for rehearsal
    extra_args: ["--max-num-batched-tokens", "32768"]   # long prefills need big activations

load:
  concurrency: 4
  prompt_tokens: 128
  max_tokens: 8
  request_timeout_s: 5

ramp:
  knob: context             # context | concurrency | batch | coloaded_model | balloon
  mode: geometric
  start: 256
  factor: 2
  ceiling: 32768
  step_s: 1

stop:                       # armed from the first request to the last
  oom_seen: true            # OOM in a response, a log line, or the process dying
  error_rate: 0.5           # more than half the requests failing ...
  window_s: 3               # ... over 3 seconds
  wall_clock_s: 90
  gpu_memory_share: 0.9999

cotenant:                   # a neighbour process took most of the card's headroom
  leave_gib: 1.0            # ... and left only 1 GiB free for the engine's activations

recovery:
  mode: auto                # the drill plays supervisor for the sim and restarts it
  restart_delay_s: 0.2
  limit_s: 30
  observe_s: 2
  p95_tolerance: 1.0

clients:
  policy: exponential       # none | immediate | exponential (back-off with jitter)
  max_attempts: 4
  base_s: 0.1
  max_s: 1

alerts:
  - name: InferenceKVCacheNearlyFull
    signal: kv_cache_usage
    threshold: 0.9
    for: 1m
    severity: warning
    owner: team-inference
    action: "cap --max-num-seqs at 48 or shorten --max-model-len; see the capacity plan"
  - name: InferencePreemptionsRising
    signal: preemption_rate
    threshold: 0.5
    for: 2m
    severity: warning
    owner: team-inference
    action: "requests are being recomputed; lower concurrency or move load to another replica"
  - name: InferenceErrorRateHigh
    signal: error_rate
    threshold: 0.05
    for: 1m
    severity: critical
    owner: oncall-inference
    action: "check the engine log for CUDA out of memory; restart with a smaller --max-num-seqs"
  - name: InferenceTargetDown
    signal: target_down
    threshold: 0
    for: 30s
    severity: page
    owner: oncall-inference
    action: "the engine is not answering scrapes; check the process and its last log lines"
  - name: GPUMemoryNearlyFull
    signal: gpu_memory_share
    threshold: 0.97
    for: 2m
    severity: warning
    owner: team-platform
    action: "find the co-tenant holding memory (nvidia-smi) and move it off this card"
"""


@dataclass(frozen=True)
class DrillDemoResult:
    run_id: str
    status: str  # completed | stopped | failed | interrupted (as DrillResult)
    summary: str  # the incident's one-line summary (failure mode, detection, recovery)
    report_path: Path
    elapsed_s: float


def demo_drill_plan(device: str, baseline_s: float | None = None, step_s: float | None = None,
                    observe_s: float | None = None) -> DrillPlan:
    """The example drill with its sim on *device* (a new document: the template is not edited).
    The windows can be shortened (tests); the port is left to the drill (a free one)."""
    import yaml

    doc = yaml.safe_load(OOM_DRILL_PLAN)
    doc["target"]["sim"]["device"] = device
    if baseline_s is not None:
        doc["baseline_s"] = baseline_s
    if step_s is not None:
        doc["ramp"]["step_s"] = step_s
    if observe_s is not None:
        doc["recovery"]["observe_s"] = observe_s
    return parse_plan(doc, "oom-drill.yaml")


def run_drill_demo(db: str | None, report_path: Path, subscribers: list[Callable[[Any], None]] | None = None,
                   on_run: Callable[[str], None] | None = None, **windows: float) -> DrillDemoResult:
    """Run the example OOM drill against its own sim; write the incident report (HTML) to *report_path*."""
    from vramlab.drill.runner import DrillRunner
    from vramlab.report import load_context, render
    from vramlab.report.incident import summary_line
    from vramlab.store import open_store

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vramlab-demo-drill-") as tmp, open_store(db) as store:
        plan = demo_drill_plan(str(Path(tmp) / "sim-gpu0.ledger"), **windows)
        runner = DrillRunner(plan, store, workdir=tmp)
        for sub in subscribers or []:
            runner.hook.add(sub)
        if on_run is not None:
            on_run(runner.run_id)
        result = asyncio.run(runner.run())
        ctx = load_context(store, result.run_id)
        text = render(ctx, "html")
        summary = summary_line(ctx)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text, encoding="utf-8")
    return DrillDemoResult(result.run_id, result.status, summary, report_path, time.monotonic() - t0)


__all__ = ["OOM_DRILL_PLAN", "DrillDemoResult", "demo_drill_plan", "run_drill_demo"]
