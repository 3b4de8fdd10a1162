"""Run a plan file end to end: checks, store, progress, signals. What ``vramlab run`` calls.

Ctrl-C or SIGTERM cancels the runner once: the load stops, in-flight requests are recorded as
cancelled, rollbacks run, the run is marked ``interrupted`` and everything collected is in the
store. Further signals while rollbacks run are ignored (the rollbacks have their own timeouts).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramlab.errors import ConfigError, VramlabError
from vramlab.experiment.events import Event, EventHook
from vramlab.experiment.plan import Plan, load_plan
from vramlab.experiment.runner import Runner, RunOptions, RunResult


@dataclass(frozen=True)
class SessionResult:
    result: RunResult
    store_url: str


def api_key_for(plan: Plan) -> str | None:
    name = plan.target.api_key_env
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"target.api_key_env: the environment variable {name} is not set")
    return value


def check_target(plan: Plan, allow_production: bool) -> None:
    if plan.target.environment == "production" and not allow_production:
        raise ConfigError("target.environment is production: refusing to load it; pass "
                          "--i-understand-this-is-production to run anyway")


async def _run_with_signals(runner: Runner) -> RunResult:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(runner.run())
    seen = [0]

    def on_signal() -> None:
        seen[0] += 1
        if seen[0] == 1:
            print("vramlab: interrupted: stopping the load, running rollbacks ...", file=sys.stderr, flush=True)
            task.cancel()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
            pass
    try:
        return await task
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None  # cancelled before the run was recorded
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def _event_loop_runner() -> Callable[[Any], Any]:
    """uvloop where it is installed (about 1.4x the request rate per core), else asyncio."""
    try:
        import uvloop

        return uvloop.run  # type: ignore[no-any-return]
    except ImportError:
        return asyncio.run


def check_reachable(plan: Plan, timeout_s: float = 5.0) -> None:
    """Refuse (ConfigError: one line, exit 2) before anything is stored when nothing answers at the
    target's address. Any HTTP answer counts as reachable (a 401 or 404 is the endpoint's to give)."""
    import urllib.error
    import urllib.request

    from vramlab.experiment.wiring import _root

    tg = plan.target
    url = tg.health_url or _root(tg.url) + "/health"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        hint = ("start the server first, or give target: {kind: sim, sim: {gpu: ...}} to let vramlab start a "
                "rehearsal server" if tg.sim is None else "the run's own sim stopped answering")
        raise ConfigError(f"target {tg.url} is not reachable ({getattr(why, 'strerror', None) or why}); nothing "
                          f"was stored; {hint}") from None


def _with_own_sim(plan: Plan, workdir: str) -> tuple[Plan, Any]:
    """Start the sim that target.sim asks for; the plan with its URL, pid and ledger filled in."""
    from vramlab.sim.launch import SimStartError, start_sim

    assert plan.target.sim is not None
    ledger = str(Path(workdir) / "sim-gpu0.ledger")
    try:
        sim = start_sim(plan.target.sim.argv(plan.target.model), device=ledger,
                        log_path=str(Path(workdir) / "sim.log"), timeout_s=60)
    except SimStartError as exc:
        last = (exc.log_tail.strip().splitlines() or ["(no log)"])[-1]
        raise ConfigError(f"target.sim: the sim did not start: {exc} — {last[:200]}") from None
    doc = plan.model_dump(mode="json")
    doc["target"].update(base_url=sim.url + "/v1", pid=sim.pid, metrics_url=None, health_url=None)
    doc["samplers"]["ledger"] = doc["samplers"].get("ledger") or ledger
    return Plan.model_validate(doc), sim


def run_plan(plan: Plan, *, plan_dir: Path, db: str | None = None, rounds: int | None = None,
             allow_production: bool = False, subscribers: list[Callable[[Event], None]] | None = None,
             options: RunOptions | None = None) -> SessionResult:
    check_target(plan, allow_production)
    if plan.target.sim is None or plan.target.base_url is not None:
        check_reachable(plan)
        return _run_checked(plan, plan_dir=plan_dir, db=db, rounds=rounds, subscribers=subscribers, options=options)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vramlab-run-sim-") as tmp:
        own, sim = _with_own_sim(plan, tmp)
        try:
            check_reachable(own)
            return _run_checked(own, plan_dir=plan_dir, db=db, rounds=rounds, subscribers=subscribers,
                                options=options)
        finally:
            sim.stop()


def _run_checked(plan: Plan, *, plan_dir: Path, db: str | None, rounds: int | None,
                 subscribers: list[Callable[[Event], None]] | None, options: RunOptions | None) -> SessionResult:
    from vramlab.experiment.recorder import StoreRecorder
    from vramlab.store import open_store

    opts = options or RunOptions()
    opts.api_key = api_key_for(plan)
    opts.rounds = rounds if rounds is not None else opts.rounds
    opts.base_dir = plan_dir
    if opts.rounds is not None and opts.rounds < 1:
        raise ConfigError("--rounds must be at least 1")
    store = open_store(db)
    try:
        hook = EventHook()
        recorder = StoreRecorder(store)
        hook.add(recorder, critical=True)  # a run that cannot be stored must not go on unrecorded
        for s in subscribers or ():
            hook.add(s)
        runner = Runner(plan, hook, opts)
        try:
            result = _event_loop_runner()(_run_with_signals(runner))
        finally:
            if recorder.run_id is not None:
                try:
                    recorder.flush()
                except Exception:  # the store went away; the run_end path already tried
                    pass
        if recorder.run_id is None:
            raise VramlabError("the run did not start")
        return SessionResult(result, store.url)
    finally:
        store.close()


def run_plan_file(path: str | Path, phase_s: float | None = None, **kw: Any) -> SessionResult:
    plan = load_plan(path)
    if phase_s is not None:
        if phase_s <= 0:
            raise ConfigError("--phase-s must be positive")
        doc = plan.model_dump(mode="json")
        doc["phases"]["duration_s"] = phase_s
        doc["phases"].pop("requests", None)
        doc["phases"]["drain_s"] = min(doc["phases"]["drain_s"], phase_s)
        plan = Plan.model_validate(doc)
    return run_plan(plan, plan_dir=Path(path).resolve().parent, **kw)
