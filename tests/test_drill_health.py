"""Health discovery (what answered, on which path) and the restart start-up allowance."""

from __future__ import annotations

import asyncio
import time

from vramlab.drill.recovery import LiveState, recover
from vramlab.load.stub import StubBehaviour, StubServer
from vramlab.observe.health import discover_health
from vramlab.plandoc import RecoverySpec
from vramlab.records.emit import Draft


def test_a_server_without_health_is_up_and_answers_on_v1_models():
    async def go():
        async with StubServer(StubBehaviour(health_status=404)) as srv:
            return await discover_health(srv.url, "/health", 5.0)

    found = asyncio.run(go())
    assert found.path == "/v1/models"
    assert found.answers["/health"].startswith("HTTP 404")
    assert "/health answered HTTP 404" in found.summary() and "the server is up" in found.summary()


def test_a_loading_server_is_waited_on_and_nothing_listening_is_said_plainly():
    async def go():
        async with StubServer(StubBehaviour(health_status=503)) as srv:
            return await discover_health(srv.url, "/health", 1.0)

    loading = asyncio.run(go())
    assert loading.path is None and list(loading.answers) == ["/health"]  # 503: the path exists, not ready
    assert loading.answers["/health"].startswith("HTTP 503")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    gone = asyncio.run(discover_health(f"http://127.0.0.1:{port}", "/healthz", 0.5))
    assert gone.path is None and gone.answers["/healthz"] == "connection refused"
    assert "nothing answered HTTP" in gone.summary()


class _SlowTarget:
    def __init__(self) -> None:
        self.restarts: list[float] = []

    def restart(self) -> None:
        self.restarts.append(time.monotonic())


def _recover_with(allowance_s: float) -> tuple[int, list[str]]:
    """The target died; every restart loads longer than the grace (health stays down all along)."""
    spec = RecoverySpec(mode="auto", restart_delay_s=0.0, liveness_grace_s=0.5, limit_s=2.5)
    state = LiveState(failed_at_s=0.0, running=False, health_up=False, health_down_since_s=0.0)
    target, msgs = _SlowTarget(), []
    t0 = time.monotonic()
    seen: list[float] = []

    def emit(draft: Draft) -> None:
        msgs.append(f"{draft.kind}: {draft.message}")

    out = asyncio.run(
        recover(
            spec,
            target,
            state,
            lambda: time.monotonic() - t0,
            emit,
            startup_allowance_s=allowance_s,
            on_restart=seen.append,
        )
    )
    assert not out.recovered and len(seen) == len(target.restarts)
    return len(target.restarts), msgs


def test_a_restart_gets_its_own_start_up_allowance():
    n, msgs = _recover_with(allowance_s=5.0)
    assert n == 1, msgs  # the loading restart is left alone
    n0, msgs0 = _recover_with(allowance_s=0.0)
    assert n0 >= 2 and any("health failing for 0.5 s" in m for m in msgs0), msgs0  # the old behaviour


def test_run_health_sampler_discovers_the_path_when_the_plan_names_none():
    from vramlab.observe.health import HealthSampler

    async def go():
        async with StubServer(StubBehaviour(health_status=404)) as srv:
            s = HealthSampler(srv.url + "/health", discover_root=srv.url)
            await s.open()
            try:
                got = {x.name: x.value for x in await s.sample()}
            finally:
                await s.close()
            return s, got

    s, got = asyncio.run(go())
    assert s.url.endswith("/v1/models") and got["health.up"] == 1.0
    assert s.open_note is not None and "/health answered HTTP 404" in s.open_note


def test_a_recovery_command_starts_the_recovery_and_its_own_exits_are_masked():
    spec = RecoverySpec(mode="scripted", command="sleep 0.4", delay_s=0.0, limit_s=1.0)
    state = LiveState(failed_at_s=0.0)
    seen: list[float] = []
    during: list[bool] = []
    t0 = time.monotonic()

    async def go():
        async def watch():
            while time.monotonic() - t0 < 0.9:
                during.append(state.restarting)
                await asyncio.sleep(0.02)

        w = asyncio.ensure_future(watch())
        out = await recover(
            spec, None, state, lambda: time.monotonic() - t0, lambda *a, **k: None, on_restart=seen.append
        )
        await w
        return out

    asyncio.run(go())
    assert len(seen) == 1 and seen[0] < 0.3  # the detector hears of it before the command runs
    assert True in during and not state.restarting  # masked while it ran, unmasked after
