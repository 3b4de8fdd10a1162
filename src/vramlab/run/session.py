"""The one session around the one runner, for every kind of run: what `vramlab run`, `vramlab
drill` and `vramlab demo` run their kind in.

- the store writer (recorder.py) on the run's events, critical: a run that cannot be stored must
  not go on unrecorded; a store that gives up stops the load and rolls back (``Runner.abort_soon``);
- the capacity plan for the target's own settings (capacity_plan.py), made by the runner once the
  target is up, with the card `--gpu` / `--gpu-memory-gib` name where the plan names none;
- signals: Ctrl-C or SIGTERM cancels the run once (the load stops, in-flight requests are recorded
  as cancelled, rollbacks run, the run is marked ``interrupted`` and everything collected is in the
  store); further signals while rollbacks run are ignored (the rollbacks have their own timeouts);
  SIGUSR1 prints what every asyncio task waits on; a watchdog leaves every thread's stack on
  stderr if the event loop stalls past the run's wall clock;
- the run's own sim (``own_sim``), when a plan asks vramlab to start its target;
- the exit policy (runner.py's ``exit_code``) and what the store holds against what the run produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from vramlab.errors import ConfigError, VramlabError
from vramlab.run.events import EventHook, Handler
from vramlab.run.kind import RunKind
from vramlab.run.runner import Runner, RunResult, exit_code

if TYPE_CHECKING:
    from vramlab.plandoc import SimSettings
    from vramlab.records.store import Store
    from vramlab.sim.launch import SimProcess

WATCHDOG_GRACE_S = 60.0


@dataclass(frozen=True)
class Card:
    """The card `--gpu` / `--gpu-memory-gib` name for the capacity plan, where the plan names none."""

    gpu: str | None = None
    gpu_memory_gib: float | None = None

    def checked(self) -> Card:
        """This card, or ConfigError (one line, exit 2) before anything runs."""
        if self.gpu_memory_gib is not None and not 0 < self.gpu_memory_gib <= 1 << 20:  # also refuses NaN
            raise ConfigError(
                f"--gpu-memory-gib: must be a positive finite number of GiB, got {self.gpu_memory_gib}"
            )
        if self.gpu is not None:
            from vramlab.capacity import get_gpu

            get_gpu(self.gpu)  # an unknown card is bad input
        return self


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

    def exit_code(self, recovered: bool = True) -> int:
        """The one exit-code policy (runner.exit_code); *recovered*: a drill's recovery verdict."""
        return exit_code(self.result.status, self.result.error, recovered)

    def error_line(self, command: str) -> str | None:
        """The error that failed the run, in one line as the CLI words every error (None: none)."""
        err = self.result.error
        if err is None:
            return None
        if isinstance(err, VramlabError):
            return f"vramlab {command}: error: {err}"
        return (
            f"vramlab {command}: internal error: {type(err).__name__}: {err} "
            "(set VRAMLAB_DEBUG=1 to see the traceback)"
        )


def run_session(
    kind: RunKind,
    store: Store,
    *,
    subscribers: Sequence[Handler] = (),
    card: Card | None = None,
    flush_s: float = 0.5,
) -> SessionResult:
    """Run *kind* into *store* (the caller opens and closes it) to its end, in the foreground of
    this process: signals, the watchdog, the event loop. Ctrl-C before the run was recorded raises
    KeyboardInterrupt."""
    watched = _watchdog(kind.wall_clock_s + WATCHDOG_GRACE_S)
    try:
        run = run_recorded(kind, store, subscribers=subscribers, card=card, flush_s=flush_s)
        return _event_loop_runner()(_with_signals(run))  # type: ignore[no-any-return]
    finally:
        if watched:
            faulthandler.cancel_dump_traceback_later()


def _watchdog(after_s: float) -> bool:
    """The wall clock is checked on the event loop; if something ever blocks the loop past it, leave
    every thread's stack on stderr so the stall can be diagnosed (the run goes on). False: this
    process's stderr is no file (a captured stream), so there is no watchdog."""
    for stream in (sys.stderr, sys.__stderr__):
        if stream is None:
            continue
        # a stream without a file descriptor raises io.UnsupportedOperation (an OSError and a ValueError)
        try:
            faulthandler.dump_traceback_later(after_s, repeat=False, file=stream)
            return True
        except (AttributeError, ValueError, OSError):
            continue
    return False


async def run_recorded(
    kind: RunKind,
    store: Store,
    *,
    subscribers: Sequence[Handler] = (),
    card: Card | None = None,
    flush_s: float = 0.5,
) -> SessionResult:
    """The run of *kind* with its store writer and capacity plan, on the running event loop (what
    ``run_session`` runs; a caller with a loop of its own, such as a test, awaits it directly)."""
    from vramlab.run.capacity_plan import start_events
    from vramlab.run.recorder import StoreRecorder

    hook = EventHook()
    recorder = StoreRecorder(store, flush_s=flush_s)
    hook.add(recorder, critical=True)  # a run that cannot be stored must not go on unrecorded
    for s in subscribers:
        hook.add(s)
    c = card or Card()
    runner = Runner(
        kind,
        hook,
        capacity_plan=lambda: start_events(kind.capacity_facts().with_card(c.gpu, c.gpu_memory_gib)),
    )

    def on_store_failure(
        reason: str,
    ) -> None:  # the writer thread gave up on the store: fail the run, roll back
        print(f"vramlab: {reason}: stopping the load, running rollbacks ...", file=sys.stderr, flush=True)
        runner.abort_soon(reason)

    recorder.on_failure = on_store_failure
    try:
        result = await runner.run()
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
        out = replace(out, result=replace(result, status="failed"))
    return out


def _event_loop_runner() -> Callable[[Any], Any]:
    from vramlab.load.workers import event_loop_runner

    return event_loop_runner()  # type: ignore[no-any-return]


async def _with_signals(run: Coroutine[Any, Any, SessionResult]) -> SessionResult:
    """*run* as a task that Ctrl-C or SIGTERM cancels once; SIGUSR1 dumps every task's stack."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(run)
    seen = [0]

    def on_signal() -> None:
        seen[0] += 1
        if seen[0] == 1:
            print(
                "vramlab: interrupted: stopping the load, running rollbacks ...", file=sys.stderr, flush=True
            )
            task.cancel()

    installed = []
    for sig, handler in (
        (signal.SIGINT, on_signal),
        (signal.SIGTERM, on_signal),
        (signal.SIGUSR1, _dump_tasks),
    ):
        try:
            loop.add_signal_handler(sig, handler)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, AttributeError):  # not the main thread, or no signals here
            pass
    try:
        return await task
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None  # cancelled before the run was recorded
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def _dump_tasks() -> None:
    """SIGUSR1: what every asyncio task is waiting on (for a run that seems stuck)."""
    tasks = asyncio.all_tasks()
    print(f"vramlab: {len(tasks)} asyncio tasks", file=sys.stderr)
    for task in tasks:
        task.print_stack(limit=8, file=sys.stderr)
    sys.stderr.flush()


@contextlib.contextmanager
def own_sim(settings: SimSettings, workdir: str, timeout_s: float = 60.0) -> Iterator[SimProcess]:
    """The sim a plan's `target.sim` asks vramlab to start for the run (`vramlab sim serve` on a
    free loopback port, its ledger and log in *workdir*), stopped however the run ends."""
    from pathlib import Path

    from vramlab.sim.launch import SimStartError, start_sim

    try:
        sim = start_sim(
            settings.argv(),
            device=str(Path(workdir) / "sim-gpu0.ledger"),
            log_path=str(Path(workdir) / "sim.log"),
            timeout_s=timeout_s,
        )
    except SimStartError as exc:
        last = (exc.log_tail.strip().splitlines() or ["(no log)"])[-1]
        raise ConfigError(f"target.sim: the sim did not start: {exc} — {last[:200]}") from None
    try:
        yield sim
    finally:
        sim.stop()


__all__ = ["Card", "SessionResult", "own_sim", "run_recorded", "run_session"]
