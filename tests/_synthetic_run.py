"""A hand-built stored run with known numbers, for analysis, report and CLI tests.

Three rounds of: baseline (concurrency 1), treatment steps at concurrency 2, 4, 8, recovery.
Every window lasts 10 s and holds 21 requests with e2e = base + 10*i ms (i = 0..20), so with the
type-7 percentile P50 = base + 100, P95 = base + 190, P99 = base + 198, max = base + 200.
Round 1's concurrency-8 step has 5 HTTP 503s (a one-off spike); round 2's recovery is slow for
its first 4 s and then back to baseline.
"""

from __future__ import annotations

from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord

RUN_ID = "7f3a91bc"
GIB = 2**30
BASE_MS = {"baseline": 100.0, 2.0: 200.0, 4.0: 400.0, 8.0: 800.0, "recovery": 100.0}
STEPS = (2.0, 4.0, 8.0)
ROUNDS = 3


def run_record(
    run_id: str = RUN_ID,
    *,
    status: str = "completed",
    model: str = "llama-3.1-8b-instruct",
    started_at: float = 1_760_000_000.0,
) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        kind="experiment",
        name="concurrency-ramp",
        plan={
            "name": "concurrency-ramp",
            "hypothesis": "P95 end-to-end latency stays under 2 s up to concurrency 8",
            "rounds": ROUNDS,
            "metrics": {"p95_e2e_ms": 950.0, "error_rate": 0.05},
            "change": {"variable": "concurrency", "steps": list(STEPS)},
            "target": {"base_url": "http://127.0.0.1:8000/v1", "api_key_env": "OPENAI_API_KEY"},
        },
        plan_hash="c0ffee" + "0" * 58,
        fixed={
            "engine": "vllm",
            "engine_version": "0.8.5",
            "model": model,
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "driver": "550.54.15",
            "vramlab_version": "0.1.0",
            "host": "gpu-01",
            "python": "3.11.7",
        },
        target={"base_url": "http://127.0.0.1:8000/v1", "api": "openai", "environment": "test"},
        change={"variable": "concurrency", "steps": list(STEPS)},
        started_at=started_at,
        ended_at=started_at + 250.0 if status != "running" else None,
        status=status,
        stop_reason=None,
        notes=["prometheus source not configured: no engine histograms"],
    )


def _window(
    run_id: str,
    rnd: int,
    phase: str,
    step: int,
    value: float | None,
    t0: float,
    base: float,
    errors: int = 0,
    slow_until_s: float = 0.0,
) -> list[RequestRecord]:
    out = []
    for i in range(21):
        sent = t0 + 0.5 * i
        e2e = base + 10.0 * i
        if sent - t0 < slow_until_s:
            e2e += 900.0
        failed = i < errors
        out.append(
            RequestRecord(
                run_id=run_id,
                round=rnd,
                phase=phase,
                step=step,
                step_value=value,
                request_id=f"{rnd}-{phase}-{step}-{i}",
                scheduled_s=sent - 0.002,
                sent_s=sent,
                first_token_s=None if failed else sent + e2e / 4000,
                end_s=sent + e2e / 1000,
                ttft_ms=None if failed else e2e / 4,
                tpot_ms=None if failed else 5.0,
                e2e_ms=e2e,
                e2e_from_scheduled_ms=e2e + 2.0,
                ttft_from_scheduled_ms=None if failed else e2e / 4 + 2.0,
                dispatch_lag_ms=2.0,
                itl_ms=[] if failed else [5.0] * 3,
                prompt_tokens=128,
                output_tokens=0 if failed else 64,
                status_code=503 if failed else 200,
                error_class="http_5xx" if failed else None,
                error="503 Service Unavailable" if failed else None,
            )
        )
    return out


def build(
    run_id: str = RUN_ID, **kw
) -> tuple[RunRecord, list[RequestRecord], list[SampleRecord], list[EventRecord]]:
    run = run_record(run_id, **kw)
    reqs: list[RequestRecord] = []
    samples: list[SampleRecord] = []
    events = [EventRecord(run_id=run_id, t_s=0.0, kind="run_start", message="run started")]
    for rnd in range(ROUNDS):
        t0 = rnd * 60.0
        layout = [
            ("baseline", 0, None),
            *(("treatment", k, v) for k, v in enumerate(STEPS)),
            ("recovery", 0, None),
        ]
        for j, (phase, step, value) in enumerate(layout):
            start = t0 + 10.0 * j
            base = BASE_MS[phase] if value is None else BASE_MS[value]
            errors = 5 if (rnd == 1 and value == 8.0) else 0
            slow = 4.0 if (rnd == 2 and phase == "recovery") else 0.0
            reqs += _window(run_id, rnd, phase, step, value, start, base, errors, slow)
            if phase != "treatment" or step == 0:
                events.append(
                    EventRecord(
                        run_id=run_id,
                        t_s=start,
                        kind="phase_start",
                        round=rnd,
                        phase=phase,
                        message=f"round {rnd} {phase} started",
                    )
                )
            if phase != "treatment" or step == len(STEPS) - 1:
                events.append(
                    EventRecord(
                        run_id=run_id,
                        t_s=start + 10.0 + 0.4 + base / 1000,
                        kind="phase_end",
                        round=rnd,
                        phase=phase,
                        message=f"round {rnd} {phase} ended",
                    )
                )
            for t in range(10):
                conc = value or 1.0
                samples.append(
                    SampleRecord(
                        run_id=run_id,
                        t_s=start + t + 0.5,
                        source="gpu",
                        name="gpu.memory_used_bytes",
                        value=float(70 * GIB + int(conc) * GIB // 4),
                        labels={"gpu": "0"},
                    )
                )
                samples.append(
                    SampleRecord(
                        run_id=run_id,
                        t_s=start + t + 0.5,
                        source="engine",
                        name="engine.kv_cache_usage_perc",
                        value=conc / 10,
                    )
                )
    events.append(
        EventRecord(
            run_id=run_id,
            t_s=95.0,
            kind="stop_condition",
            round=1,
            phase="treatment",
            step=2,
            message="error rate 23.8% > 20% for 5 s",
            data={"metric": "error_rate"},
        )
    )
    events.append(
        EventRecord(
            run_id=run_id,
            t_s=95.5,
            kind="rollback",
            round=1,
            phase="treatment",
            message="rollback: curl -X POST http://127.0.0.1:8000/reset",
            data={"rc": 0},
        )
    )
    events.append(
        EventRecord(run_id=run_id, t_s=120.0, kind="warning", message="engine /metrics scrape took 1.2 s")
    )
    return run, reqs, samples, events


def insert(store, run_id: str = RUN_ID, **kw) -> RunRecord:
    run, reqs, samples, events = build(run_id, **kw)
    store.create_run(run)
    store.add_requests(run_id, reqs)
    store.add_samples(run_id, samples)
    store.add_events(run_id, events)
    return run
