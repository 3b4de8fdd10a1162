"""Recovery: auto (the target or its supervisor restarts it), scripted (a command after an operator
delay) or manual (the drill waits while the operator records actions with `vramlab note`).

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

from vramlab.drill.plan import RecoverySpec
from vramlab.drill.target import TargetCommandError, run_command


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


Emit = Callable[..., None]


async def recover(
    spec: RecoverySpec,
    target: Any,
    state: LiveState,
    now: Callable[[], float],
    emit: Emit,
    operator_notes: Callable[[float], list[str]] | None = None,
    supervised_by_drill: bool = True,
    startup_allowance_s: float = 0.0,
    on_restart: Callable[[float], None] | None = None,
) -> RecoveryOutcome:
    """Drive recovery until the target serves again or `spec.limit_s` passes (from the failure)."""
    start = state.failed_at_s if state.failed_at_s is not None else now()
    deadline = start + spec.limit_s
    mitigations = 0
    restart_delay = spec.restart_delay_s
    last_restart = -1e9
    scripted_done = False
    notes_seen = 0
    announced = False
    polled = -1e9
    while now() < deadline:
        if state.serving():
            if spec.mode == "manual" and operator_notes is not None and notes_seen == 0:
                # The operator's note and the target coming back can fall between two polls: a note
                # recorded before it served again is still the mitigation that brought it back.
                notes = await asyncio.to_thread(operator_notes, start)
                if notes:
                    emit("mitigation", f"operator: {notes[0]}", action="operator", by="operator")
                    mitigations += 1
            return RecoveryOutcome(True, state.last_success_s, mitigations, "serving again")
        t = now()
        if spec.mode == "auto" and supervised_by_drill:
            # The drill plays the supervisor (systemd Restart=on-failure, a k8s liveness probe).
            dead = not state.running
            # health failing counts only from the end of the last restart's start-up allowance
            down_from = (
                None
                if state.health_down_since_s is None
                else max(state.health_down_since_s, last_restart + startup_allowance_s)
            )
            stuck = down_from is not None and t - down_from >= spec.liveness_grace_s and state.running
            if (dead or stuck) and t - last_restart >= restart_delay:
                await asyncio.sleep(spec.restart_delay_s if dead else 0.0)
                why = (
                    "process exited"
                    if dead
                    else (
                        f"health failing for {spec.liveness_grace_s:g} s"
                        + (
                            f" after a {startup_allowance_s:g} s start-up allowance"
                            if last_restart > -1e8
                            else ""
                        )
                    )
                )
                issued = now()
                last_restart = issued
                if on_restart is not None:
                    on_restart(last_restart)
                state.restarting = True
                try:
                    await asyncio.to_thread(target.restart)
                    state.running = True
                    # credited only once it happened: a restart that failed, or is still stuck
                    # stopping the old process, brought nothing back
                    how = getattr(target, "last_stop", None)
                    emit(
                        "mitigation",
                        f"supervisor restart ({why})" + (f"; the old process: {how}" if how else ""),
                        action="restart",
                        by="supervisor",
                        reason=why,
                        startup_allowance_s=startup_allowance_s,
                        issued_s=issued,
                        stopped_by=how,
                    )
                    mitigations += 1
                except TargetCommandError as exc:
                    emit("warning", f"restart failed: {exc}", action="restart", issued_s=issued)
                finally:
                    state.restarting = False
                restart_delay = min(
                    max(restart_delay * 2, 0.5), 5.0
                )  # a crash loop backs off, as systemd does
        elif spec.mode == "scripted" and not scripted_done:
            if t - start >= spec.delay_s:
                scripted_done = True
                emit("mitigation", f"recovery command: {spec.command}", action="script", by="script")
                mitigations += 1
                if on_restart is not None:  # what the command does to the process is recovery, not the fault
                    on_restart(now())
                state.restarting = True  # while the command runs, the exits it causes are its own
                try:
                    res = await asyncio.to_thread(run_command, spec.command or "", spec.limit_s, "recovery")
                    emit(
                        "recovery_command",
                        f"recovery command exited {res.exit_code}",
                        exit_code=res.exit_code,
                        output=res.output[-500:],
                    )
                    state.running = True
                except TargetCommandError as exc:
                    emit("warning", str(exc))
                finally:
                    state.restarting = False
        elif spec.mode == "manual":
            if not announced:
                announced = True
                emit(
                    "waiting_for_operator",
                    "manual recovery: act on the target and record each action with "
                    '`vramlab note RUN_ID "what you did"`',
                    mode="manual",
                )
            if operator_notes is not None and t - polled >= 0.5:  # notes come through the store: poll gently
                polled = t
                notes = await asyncio.to_thread(operator_notes, start)
                if len(notes) > notes_seen:
                    if notes_seen == 0:
                        emit("mitigation", f"operator: {notes[0]}", action="operator", by="operator")
                        mitigations += 1
                        if on_restart is not None:
                            on_restart(now())
                    notes_seen = len(notes)
        await asyncio.sleep(0.05)
    if state.serving():
        return RecoveryOutcome(True, state.last_success_s, mitigations, "serving again")
    return RecoveryOutcome(
        False, None, mitigations, f"not serving again within the recovery limit of {spec.limit_s:g} s"
    )


__all__ = ["LiveState", "RecoveryOutcome", "recover"]
