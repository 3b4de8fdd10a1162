"""Recovery modes: manual (the operator's `vramlab note` through the store is the mitigation),
scripted (a real command after the operator delay), and a restart that is refused (not recovered,
rollback still run)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from vramlab.drill.kind import DrillKind
from vramlab.drill.plan import parse_plan
from vramlab.drill.recovery import LiveState, recover
from vramlab.drill.start import run_drill_kind
from vramlab.plandoc import RecoverySpec
from vramlab.store import open_store

ROOT = Path(__file__).resolve().parents[1]


def _plan(tmp_path: Path, **recovery):
    doc = yaml.safe_load((ROOT / "examples" / "oom-drill.yaml").read_text())
    doc["target"]["sim"]["device"] = str(tmp_path / "gpu0.ledger")
    doc["baseline_s"], doc["ramp"]["step_s"] = 1.0, 0.7
    doc["recovery"].update(recovery)
    return parse_plan(doc)


@pytest.mark.slow
def test_manual_recovery_waits_for_operator_note(tmp_path):
    from vramlab.cli.main import main

    db = str(tmp_path / "s.db")
    store = open_store(db)
    plan = _plan(tmp_path, mode="manual", limit_s=20, observe_s=0.5)
    no_retry = plan.load.model_copy(update={"retry": plan.load.retry.model_copy(update={"policy": "none"})})
    runner = DrillKind(plan.model_copy(update={"load": no_retry}), store)

    async def operator() -> None:
        while True:
            kinds = {e.kind for e in await asyncio.to_thread(store.events, runner.run_id)}
            if "waiting_for_operator" in kinds:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # the drill must not act on its own meanwhile
        assert (
            await asyncio.to_thread(main, ["note", runner.run_id, "restarted the engine by hand", "--db", db])
            == 0
        )
        await asyncio.to_thread(runner.target.restart)

    async def both() -> None:
        op = asyncio.ensure_future(operator())
        await run_drill_kind(runner, store)
        await op

    asyncio.run(asyncio.wait_for(both(), 60))
    events = store.events(runner.run_id)
    mitigations = [e for e in events if e.kind == "mitigation"]
    assert len(mitigations) == 1 and mitigations[0].message == "operator: restarted the engine by hand"
    assert any(e.kind == "recovered" for e in events)
    note = next(e for e in events if e.kind == "note")
    assert note.t_s <= mitigations[0].t_s + 0.6  # seen within one poll of the store
    assert all(r.attempt == 0 for r in store.requests(runner.run_id))  # load.retry: policy none


def test_scripted_recovery_runs_command_after_delay(tmp_path):
    marker = tmp_path / "ran"
    spec = RecoverySpec(mode="scripted", command=f"touch {marker}", delay_s=0.3, limit_s=5)
    state = LiveState(failed_at_s=0.0)
    events: list[tuple[str, str]] = []
    loop_t0 = [0.0]

    async def go():
        loop_t0[0] = asyncio.get_running_loop().time()

        def now() -> float:
            return asyncio.get_running_loop().time() - loop_t0[0]

        async def service_comes_back():
            while not marker.exists():
                await asyncio.sleep(0.02)
            state.last_success_s = now()

        back = asyncio.ensure_future(service_comes_back())
        out = await recover(
            spec, target=None, state=state, now=now, emit=lambda d: events.append((d.kind, d.message))
        )
        await back
        return out, now

    out, _ = asyncio.run(go())
    assert out.recovered and out.mitigations == 1
    assert marker.exists()
    assert out.served_again_s is not None and out.served_again_s >= 0.3  # not before the operator delay
    assert ("mitigation", f"recovery command: touch {marker}") in events


def test_recovery_limit_reports_not_recovered():
    spec = RecoverySpec(mode="manual", limit_s=0.4)
    state = LiveState(failed_at_s=0.0)

    async def go():
        t0 = asyncio.get_running_loop().time()
        return await recover(
            spec,
            None,
            state,
            lambda: asyncio.get_running_loop().time() - t0,
            lambda *a, **k: None,
            operator_notes=lambda t: [],
        )

    out = asyncio.run(go())
    assert not out.recovered and "0.4 s" in out.reason


@pytest.mark.slow
def test_restart_refused_next_to_cotenant_is_not_recovered_and_rolled_back(tmp_path):
    """vLLM checks free memory at start-up: with the co-tenant still there, every restart is refused."""
    doc = yaml.safe_load((ROOT / "examples" / "oom-drill.yaml").read_text())
    doc["target"]["sim"].update(device=str(tmp_path / "gpu0.ledger"), engine="vllm")
    doc["target"]["engine"] = "vllm"
    doc["baseline_s"], doc["ramp"]["step_s"] = 1.0, 0.7
    doc["recovery"].update(limit_s=3, observe_s=0)
    doc["load"]["retry"] = {"policy": "immediate", "max_attempts": 5}
    doc["alerts"] = []
    store = open_store(str(tmp_path / "s.db"))
    runner = DrillKind(parse_plan(doc), store)
    result = asyncio.run(asyncio.wait_for(run_drill_kind(runner, store), 60))
    assert result.status == "completed" and result.failed_rounds == [0]
    kinds = [e.kind for e in store.events(runner.run_id)]
    assert "not_recovered" in kinds and "startup_refusal" in kinds
    # immediate retries: a request's attempts follow each other with no back-off
    by_id: dict[str, list] = {}
    for r in store.requests(runner.run_id):
        by_id.setdefault(r.request_id, []).append(r)
    chains = [sorted(v, key=lambda r: r.attempt) for v in by_id.values() if len(v) == 5]
    assert chains, "no request used all 5 attempts against the dead target"
    gaps = [b.sent_s - a.end_s for c in chains for a, b in zip(c, c[1:], strict=False)]
    assert max(gaps) < 0.25  # back-off would wait >= its base delay; scheduling on a busy box takes ~0.06 s
    assert kinds.count("rollback") >= 2
    mode = [e for e in store.events(runner.run_id) if e.kind == "failure_mode"][-1].data["mode"]
    assert mode == "crash_after_oom+startup_refusal_on_restart"
    from vramlab.sim.ledger import DeviceLedger

    assert DeviceLedger(str(tmp_path / "gpu0.ledger")).memory_info(0)[1] == 0
