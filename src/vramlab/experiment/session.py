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
from vramlab.records.store import Store


@dataclass(frozen=True)
class SessionResult:
    result: RunResult
    store_url: str
    received: dict[str, int] | None = None  # rows the run produced, per table
    stored: dict[str, int] | None = None  # rows the store holds for it, counted back (None: unreadable)
    store_failure: str | None = None  # the write error that stopped the run
    spooled: tuple[str, int] | None = None  # (file, rows) the store refused, written there instead

    @property
    def store_complete(self) -> bool:
        return (
            self.store_failure is None
            and self.received is not None
            and self.stored is not None
            and all(self.stored.get(k, 0) >= n for k, n in self.received.items())
        )

    def stored_line(self) -> str:
        """Exactly what the store holds, against what the run produced, and where the rest went."""
        if self.received is None:
            return ""
        spool = (
            ""
            if self.spooled is None
            else f"; the {self.spooled[1]} rows it refused are in {self.spooled[0]}"
        )
        if self.stored is None:
            return "the store could not be read back to count what it holds" + spool
        held = ", ".join(f"{self.stored.get(k, 0)} of {n} {k}" for k, n in self.received.items())
        return "the store holds " + held + spool


def api_key_for(plan: Plan) -> str | None:
    name = plan.target.api_key_env
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"target.api_key_env: the environment variable {name} is not set")
    from vramlab.redact import register

    register(value)  # masked wherever a server or a message echoes it (vramlab.redact)
    return value


def check_target(plan: Plan, allow_production: bool) -> None:
    if plan.target.environment == "production" and not allow_production:
        raise ConfigError(
            "target.environment is production: refusing to load it; pass "
            "--i-understand-this-is-production to run anyway"
        )


async def _run_with_signals(runner: Runner, recorder: Any = None) -> RunResult:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(runner.run())
    if recorder is not None:  # the writer thread gave up on the store: fail the run, roll back

        def on_store_failure(reason: str) -> None:
            print(f"vramlab: {reason}: stopping the load, running rollbacks ...", file=sys.stderr, flush=True)
            runner.abort_soon(reason)

        recorder.on_failure = on_store_failure
    seen = [0]

    def on_signal() -> None:
        seen[0] += 1
        if seen[0] == 1:
            print(
                "vramlab: interrupted: stopping the load, running rollbacks ...", file=sys.stderr, flush=True
            )
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
    from vramlab.load.workers import event_loop_runner

    return event_loop_runner()  # type: ignore[no-any-return]


def check_reachable(plan: Plan, timeout_s: float = 5.0) -> None:
    """Refuse (ConfigError: one line, exit 2) before anything is stored when nothing answers at the
    target's address. Any HTTP answer counts as reachable (a 401 or 404 is the endpoint's to give)."""
    import http.client
    import urllib.error
    import urllib.parse
    import urllib.request

    from vramlab.experiment.wiring import _root

    tg = plan.target
    parts = urllib.parse.urlsplit(tg.health_url or _root(tg.url) + "/health")
    # urllib would take user:password@ for part of the host name; any answer (a 401 too) will do here.
    url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout_s):
            return
    except (urllib.error.HTTPError, http.client.HTTPException):
        return  # it answered HTTP (an error, over 100 headers, a bad status line): the samplers say more
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        hint = (
            "start the server first, or give target: {kind: sim, sim: {gpu: ...}} to let vramlab start a "
            "rehearsal server"
            if tg.sim is None
            else "the run's own sim stopped answering"
        )
        raise ConfigError(
            f"target {tg.url} is not reachable ({getattr(why, 'strerror', None) or why}); nothing "
            f"was stored; {hint}"
        ) from None


def run_plan(
    plan: Plan,
    *,
    plan_dir: Path,
    open_store: Callable[[], Store],
    rounds: int | None = None,
    allow_production: bool = False,
    subscribers: list[Callable[[Event], None]] | None = None,
    options: RunOptions | None = None,
    start_sim: Callable[[Plan, str], tuple[Plan, Any]] | None = None,
) -> SessionResult:
    """Run *plan* into the store *open_store* opens (after the checks: a refused plan, or one whose
    target does not answer, touches no store); the store is closed when the run ends. The caller
    picks the store (`vramlab run`: `vramlab.store.open_store(--db)`), so this package depends on
    the `Store` port only. A plan with `target.sim` gets its own rehearsal server for the run from
    *start_sim* (the CLI's `vramlab.cli.run.start_own_sim`: this package does not import the sim)."""
    check_target(plan, allow_production)
    if plan.target.sim is None or plan.target.base_url is not None:
        check_reachable(plan)
        return _run_checked(
            plan,
            plan_dir=plan_dir,
            open_store=open_store,
            rounds=rounds,
            subscribers=subscribers,
            options=options,
        )
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vramlab-run-sim-") as tmp:
        if start_sim is None:
            raise ConfigError("target.sim: this caller cannot start a rehearsal server; give target.base_url")
        own, sim = start_sim(plan, tmp)
        try:
            check_reachable(own)
            return _run_checked(
                own,
                plan_dir=plan_dir,
                open_store=open_store,
                rounds=rounds,
                subscribers=subscribers,
                options=options,
            )
        finally:
            sim.stop()


def _run_checked(
    plan: Plan,
    *,
    plan_dir: Path,
    open_store: Callable[[], Store],
    rounds: int | None,
    subscribers: list[Callable[[Event], None]] | None,
    options: RunOptions | None,
) -> SessionResult:
    from vramlab.experiment.recorder import StoreRecorder

    opts = options or RunOptions()
    opts.api_key = api_key_for(plan)
    opts.rounds = rounds if rounds is not None else opts.rounds
    opts.base_dir = plan_dir
    if opts.rounds is not None and opts.rounds < 1:
        raise ConfigError("--rounds must be at least 1")
    store = open_store()
    try:
        hook = EventHook()
        recorder = StoreRecorder(store)
        hook.add(recorder, critical=True)  # a run that cannot be stored must not go on unrecorded
        for s in subscribers or ():
            hook.add(s)
        runner = Runner(plan, hook, opts)
        try:
            result = _event_loop_runner()(_run_with_signals(runner, recorder))
        finally:
            recorder.close()
            if recorder.run_id is not None and recorder.failure is None:
                recorder.flush()  # rows of a run that ended without run_end (it retries, then counts them)
        if recorder.run_id is None:
            raise VramlabError("the run did not start")
        acct = recorder.accounting()
        try:
            stored: dict[str, int] | None = store.count(recorder.run_id)
        except Exception:
            stored = None
        out = SessionResult(result, store.url, acct.received, stored, acct.failure, acct.spooled)
        if not out.store_complete and result.status != "failed":
            # No run is reported as completed (or stopped) with fewer rows than it counted.
            from dataclasses import replace

            out = replace(out, result=replace(result, status="failed"))
        return out
    finally:
        store.close()


def run_plan_file(path: str | Path, phase_s: float | None = None, **kw: Any) -> SessionResult:
    plan = load_plan(path)
    if phase_s is not None:
        import math

        if not math.isfinite(phase_s) or phase_s <= 0:
            raise ConfigError(f"--phase-s must be a positive number of seconds, got {phase_s}")
        doc = plan.model_dump(mode="json")
        doc["phases"]["duration_s"] = phase_s
        doc["phases"].pop("requests", None)
        doc["phases"]["drain_s"] = min(doc["phases"]["drain_s"], phase_s)
        from vramlab.planfile import validate

        plan = validate(Plan, doc, f"{path} with --phase-s {phase_s:g}").with_notes_of(
            plan
        )  # an error is one line
    return run_plan(plan, plan_dir=Path(path).resolve().parent, **kw)
