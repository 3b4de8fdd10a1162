"""Failure modes other than a crash: 429 overload (TGI's semaphore) and preemption without errors
(vLLM's KV pool full), each a short in-process drill against the sim."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from vramlab.analysis.incident import analyse
from vramlab.drill.kind import DrillKind
from vramlab.drill.plan import parse_plan
from vramlab.drill.start import run_drill_kind
from vramlab.store import open_store

pytestmark = pytest.mark.slow


def _doc(tmp_path: Path, sim: dict, ramp: dict, **top) -> dict:
    return {
        "name": "mode",
        "rounds": 1,
        "baseline_s": 1.0,
        "target": {
            "kind": "sim",
            "environment": "test",
            "engine": sim["engine"],
            "sim": {
                "gpu": "l4",
                "speed": 200,
                "watchdog_s": 0.5,
                "device": str(tmp_path / "gpu.ledger"),
                **sim,
            },
        },
        "load": {"concurrency": 2, "prompt_tokens": 64, "max_tokens": 8, "request_timeout_s": 5},
        "ramp": {"knob": "concurrency", "mode": "geometric", "factor": 2, "step_s": 0.8, **ramp},
        # users back off after a refusal (load/driver.py), so refusals are a smaller share than the
        # overloaded users: a 10 % error stop, not 30 %
        "stop": {"error_rate": 0.1, "window_s": 1.0, "min_requests": 3, "wall_clock_s": 60},
        "recovery": {"mode": "auto", "limit_s": 10, "observe_s": 0.5},
        **top,
    }


def _run(tmp_path: Path, doc: dict):
    store = open_store(str(tmp_path / "s.db"))
    runner = DrillKind(parse_plan(doc), store)
    asyncio.run(asyncio.wait_for(run_drill_kind(runner, store), 60))
    rid = runner.run_id
    return store, rid, analyse(store.requests(rid), store.samples(rid), store.events(rid), p95_tolerance=2.0)


def test_overload_429_is_named_and_recovers_without_restart(tmp_path):
    doc = _doc(
        tmp_path,
        {
            "model": "qwen2.5-0.5b-instruct",
            "engine": "tgi",
            "max_model_len": 4096,
            "extra_args": ["--max-concurrent-requests", "6"],
        },
        {"start": 2, "ceiling": 32},
        load={"concurrency": 2, "prompt_tokens": 64, "max_tokens": 64, "request_timeout_s": 5},
    )
    doc["recovery"]["observe_s"] = 2.0
    store, rid, inc = _run(tmp_path, doc)
    assert inc.failed and inc.failure_mode == "overload_429"
    assert inc.impact.error_classes.get("http_4xx", 0) > 0
    kinds = [e.kind for e in store.events(rid)]
    assert (
        "process_exit" not in kinds and "mitigation" not in kinds
    )  # nothing to restart: shedding load was enough
    assert inc.recovery.recovered
    assert (inc.failure_step or {})["value"] > 6  # only past the semaphore's size


def test_preemption_without_errors_reaches_the_ceiling(tmp_path):
    # a KV pool of a few thousand tokens: long prompts from many users must be preempted, not fail
    doc = _doc(
        tmp_path,
        {
            "model": "qwen2.5-0.5b-instruct",
            "engine": "vllm",
            "gpu_memory_utilization": 0.12,
            "max_model_len": 4096,
            # no prefix cache: the pool fills with every request's own blocks whatever the prompts share
            "extra_args": ["--no-enable-prefix-caching"],
        },
        {"start": 4, "ceiling": 64},
        # answers long enough that running requests outgrow the pool while decoding (every prompt is new, so
        # their lengths differ and they do not grow in step)
        load={"concurrency": 2, "prompt_tokens": 2048, "max_tokens": 256, "request_timeout_s": 10},
    )
    store, rid, inc = _run(tmp_path, doc)
    assert not inc.failed and inc.failure_mode == "none"
    assert inc.ceiling is not None and inc.ceiling["value"] == 64
    pre = [s.value for s in store.samples(rid) if s.name == "engine.num_preemptions_total"]
    assert pre and max(pre) > 0  # the engine preempted ...
    assert all(
        r.ok for r in store.requests(rid) if r.error_class != "cancelled"
    )  # ... and nobody saw an error
    assert "engine.num_preemptions_total" in [o.name for o in inc.signals.order]


def test_refusals_for_length_at_the_ceiling_are_failures_not_a_ceiling_held(tmp_path):
    # the context ramp reaches the model's length: every request of the last step is refused (HTTP 400,
    # vLLM's words). The target never failed, so no fault; but the drill never says it "held at the
    # ceiling", its impact table never says "failed attempts 0", and the refusals are the observed
    # saturation at their step
    from vramlab.report import load_context, render
    from vramlab.report.incident import summary_line

    doc = _doc(
        tmp_path,
        {"model": "qwen2.5-0.5b-instruct", "engine": "vllm", "max_model_len": 2048},
        {"knob": "context", "start": 512, "ceiling": 2048, "step_s": 0.6},
        load={"concurrency": 2, "prompt_tokens": 64, "max_tokens": 8, "request_timeout_s": 5},
    )
    doc["stop"]["error_rate"] = 1.0  # refusals are the engine's answer, not a failure of the target
    store, rid, inc = _run(tmp_path, doc)
    assert not inc.failed
    ceiling = next(e for e in store.events(rid) if e.kind == "ceiling")
    assert "but" in ceiling.message and "maximum context length" in ceiling.message, ceiling.message
    ctx = load_context(store, rid)
    line = summary_line(ctx)
    assert "held at the ceiling" not in line and "ramp requests failed, from 2048 prompt tokens" in line, line
    md = render(ctx, "md")
    assert "| failed attempts | 0 |" not in md and re.search(r"\| failed attempts in the ramp \| [1-9]", md)
    sat = render(ctx, "json")
    import json

    refusal = json.loads(sat)["sections"]["composition"]["saturation"]["refusal"]
    assert refusal["value"] == 2048 and refusal["step"] == 3 and "maximum context length" in refusal["detail"]
