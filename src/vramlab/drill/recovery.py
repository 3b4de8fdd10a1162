"""Recovery: auto (the target or its supervisor restarts it), scripted (a command after an operator
delay) or manual (the drill waits while the operator records actions with `vramlab note`), each
mode one small class polled by ``recover``.

Whatever the mode, the drill waits until the target serves again (health 200 if health failed,
and a successful generation after the failure) or the recovery limit passes. The first corrective
action is the *mitigation* on the timeline.

A restart gets its own start-up allowance: the supervisor judges a restarted target's health only
once `startup_allowance_s` has passed since that restart (sized from the first start's measured
load time, or the plan's `recovery.startup_s`), so it never kills a start that is still loading.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramlab.drill.target import TargetCommandError, run_command
from vramlab.plandoc import RecoverySpec
from vramlab.records import emit as E
from vramlab.records.emit import Emitter
from vramlab.records.event_payloads import MitigationData


@dataclass
class LiveState:
    """What the runner's watchers know right now (updated from their callbacks)."""

    failed_at_s: float | None = None
    last_success_s: float | None = None
    health_up: bool | None = None
    health_down_since_s: float | None = None
    health_ever_failed: bool = False
    running: bool = True
    restarting: bool = False  # the supervisor is stopping and starting the target: its exit is ours

    def serving(self) -> bool:
        if self.failed_at_s is None or self.last_success_s is None or self.last_success_s <= self.failed_at_s:
            return False
        return not self.health_ever_failed or bool(self.health_up)


@dataclass(frozen=True)
class RecoveryOutcome:
    recovered: bool
    served_again_s: float | None
    mitigations: int
    reason: str


POLL_S = 0.05  # how often recovery looks at the live state


@dataclass
class _Recovery:
    """What every recovery mode reads, and the mitigations it credits."""

    spec: RecoverySpec
    target: Any
    state: LiveState
    now: Callable[[], float]
    emit: Emitter
    operator_notes: Callable[[float], list[str]] | None
    on_restart: Callable[[float], None] | None
    start: float
    mitigations: int = 0

    def mitigated(self, message: str, data: MitigationData) -> None:
        self.emit(E.MITIGATION(message, data))
        self.mitigations += 1

    def restarted(self) -> None:
        """What the mitigation does to the process next is recovery, not the fault."""
        if self.on_restart is not None:
            self.on_restart(self.now())


async def recover(
    spec: RecoverySpec,
    target: Any,
    state: LiveState,
    now: Callable[[], float],
    emit: Emitter,
    operator_notes: Callable[[float], list[str]] | None = None,
    supervised_by_drill: bool = True,
    startup_allowance_s: float = 0.0,
    on_restart: Callable[[float], None] | None = None,
) -> RecoveryOutcome:
    """Drive recovery until the target serves again or `spec.limit_s` passes (from the failure):
    each poll, the plan's recovery mode acts (``_Supervisor``, ``_Script``, ``_Operator``)."""
    start = state.failed_at_s if state.failed_at_s is not None else now()
    r = _Recovery(spec, target, state, now, emit, operator_notes, on_restart, start)
    mode: _Supervisor | _Script | _Operator | None = None
    if spec.mode == "auto" and supervised_by_drill:
        mode = _Supervisor(r, startup_allowance_s)
    elif spec.mode == "scripted":
        mode = _Script(r)
    elif spec.mode == "manual":
        mode = _Operator(r)
    while now() < start + spec.limit_s:
        if state.serving():
            if isinstance(mode, _Operator):
                await mode.credit_the_note_that_brought_it_back()
            return RecoveryOutcome(True, state.last_success_s, r.mitigations, "serving again")
        if mode is not None:
            await mode.poll()
        await asyncio.sleep(POLL_S)
    if state.serving():
        return RecoveryOutcome(True, state.last_success_s, r.mitigations, "serving again")
    return RecoveryOutcome(
        False, None, r.mitigations, f"not serving again within the recovery limit of {spec.limit_s:g} s"
    )


class _Supervisor:
    """auto: the drill plays the supervisor (systemd Restart=on-failure, a k8s liveness probe):
    it restarts a target that exited, or whose health failed for `liveness_grace_s` after the last
    restart's start-up allowance; a crash loop backs off, as systemd does."""

    def __init__(self, r: _Recovery, startup_allowance_s: float) -> None:
        self.r, self.allowance_s = r, startup_allowance_s
        self.delay_s = r.spec.restart_delay_s
        self.last_restart = -1e9

    async def poll(self) -> None:
        r, spec, state = self.r, self.r.spec, self.r.state
        t, dead = r.now(), not state.running
        # health failing counts only from the end of the last restart's start-up allowance
        down_from = (
            None
            if state.health_down_since_s is None
            else max(state.health_down_since_s, self.last_restart + self.allowance_s)
        )
        stuck = down_from is not None and t - down_from >= spec.liveness_grace_s and state.running
        if not (dead or stuck) or t - self.last_restart < self.delay_s:
            return
        await asyncio.sleep(spec.restart_delay_s if dead else 0.0)
        allowance = f" after a {self.allowance_s:g} s start-up allowance" if self.last_restart > -1e8 else ""
        why = "process exited" if dead else f"health failing for {spec.liveness_grace_s:g} s{allowance}"
        await self._restart(why)
        self.delay_s = min(max(self.delay_s * 2, 0.5), 5.0)

    async def _restart(self, why: str) -> None:
        r, state = self.r, self.r.state
        issued = self.last_restart = r.now()
        if r.on_restart is not None:
            r.on_restart(issued)
        state.restarting = True
        try:
            await asyncio.to_thread(r.target.restart)
            state.running = True
            # credited only once it happened: a restart that failed, or is still stuck stopping the
            # old process, brought nothing back
            how = getattr(r.target, "last_stop", None)
            r.mitigated(
                f"supervisor restart ({why})" + (f"; the old process: {how}" if how else ""),
                {
                    "action": "restart",
                    "by": "supervisor",
                    "reason": why,
                    "startup_allowance_s": self.allowance_s,
                    "issued_s": issued,
                    "stopped_by": how,
                },
            )
        except TargetCommandError as exc:
            r.emit(E.WARNING(f"restart failed: {exc}", {"action": "restart", "issued_s": issued}))
        finally:
            state.restarting = False


class _Script:
    """scripted: the plan's recovery command, once, after the operator delay `delay_s`."""

    def __init__(self, r: _Recovery) -> None:
        self.r, self.done = r, False

    async def poll(self) -> None:
        r, spec = self.r, self.r.spec
        if self.done or r.now() - r.start < spec.delay_s:
            return
        self.done = True
        r.mitigated(f"recovery command: {spec.command}", {"action": "script", "by": "script"})
        r.restarted()
        r.state.restarting = True  # while the command runs, the exits it causes are its own
        try:
            res = await asyncio.to_thread(run_command, spec.command or "", spec.limit_s, "recovery")
            r.emit(
                E.RECOVERY_COMMAND(
                    f"recovery command exited {res.exit_code}",
                    {"exit_code": res.exit_code, "output": res.output[-500:]},
                )
            )
            r.state.running = True
        except TargetCommandError as exc:
            r.emit(E.WARNING(str(exc)))
        finally:
            r.state.restarting = False


class _Operator:
    """manual: the drill waits while the operator acts and records each action with `vramlab
    note`; the first note after the failure is the mitigation (notes come through the store, so
    they are polled gently)."""

    def __init__(self, r: _Recovery) -> None:
        self.r, self.announced, self.seen, self.polled = r, False, 0, -1e9

    async def poll(self) -> None:
        r = self.r
        if not self.announced:
            self.announced = True
            r.emit(
                E.WAITING_FOR_OPERATOR(
                    "manual recovery: act on the target and record each action with "
                    '`vramlab note RUN_ID "what you did"`',
                    {"mode": "manual"},
                )
            )
        t = r.now()
        if r.operator_notes is None or t - self.polled < 0.5:
            return
        self.polled = t
        notes = await asyncio.to_thread(r.operator_notes, r.start)
        if len(notes) > self.seen:
            if self.seen == 0:
                r.mitigated(f"operator: {notes[0]}", {"action": "operator", "by": "operator"})
                r.restarted()
            self.seen = len(notes)

    async def credit_the_note_that_brought_it_back(self) -> None:
        """The operator's note and the target coming back can fall between two polls: a note
        recorded before it served again is still the mitigation that brought it back."""
        r = self.r
        if r.operator_notes is None or self.seen:
            return
        notes = await asyncio.to_thread(r.operator_notes, r.start)
        if notes:
            r.mitigated(f"operator: {notes[0]}", {"action": "operator", "by": "operator"})


__all__ = ["LiveState", "RecoveryOutcome", "recover"]
