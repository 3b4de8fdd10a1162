"""How a drill says its step failed, on the timeline: the target's failure (``stop_condition``
when a stop condition fired, ``detect``, and ``fault`` with T0, the step, its mode and evidence),
or the drill's own wall clock running out (``stop_condition`` and ``stopped``: the target did not
fail, so no fault and no recovery)."""

from __future__ import annotations

from vramlab.drill.detect import STOP_KINDS, WALL_CLOCK, Detector, Finding
from vramlab.drill.ramp import RampSpec
from vramlab.records import emit as E
from vramlab.records.emit import Emitter
from vramlab.records.event_payloads import FaultData
from vramlab.run.baseline_check import BaselineTally


def say_failure(
    emit: Emitter,
    ramp: RampSpec,
    detector: Detector,
    f: Finding,
    step: int,
    value: float,
    last_safe: float | None,
    step_started_s: float,
    tally: BaselineTally | None,
) -> None:
    """The events of a failed step (*f*: the detector's finding; *tally*: the step's requests)."""
    if f.kind == WALL_CLOCK:
        emit(E.STOP_CONDITION(f.message, {"condition": f.kind}))
        emit(
            E.STOPPED(
                f"stopped by the wall clock during {ramp.knob} = {value:g} {ramp.unit}; "
                f"{step_failures(tally)} (last completed step: "
                f"{'none' if last_safe is None else f'{last_safe:g}'})",
                {"value": value, "last_completed": last_safe, "unit": ramp.unit},
            )
        )
        return
    if f.kind in STOP_KINDS:
        emit(E.STOP_CONDITION(f.message, {"condition": f.kind}))
    emit(E.DETECT(f"detected: {f.message}", {"condition": f.kind, "source": f.source}))
    # T0 is the failure itself: its first evidence (a failed request's end, the exit, the OOM line)
    t0 = detector.first_evidence_s()
    data: FaultData = {
        "step": step,
        "value": value,
        "knob": ramp.knob,
        "unit": ramp.unit,
        "step_started_s": step_started_s,
        "t0_s": t0 if t0 is not None else f.t_s,
        "last_safe_value": last_safe,
        "mode": detector.failure_mode(),
        "evidence": detector.evidence(),
        "signature": detector.signature(),
    }
    emit(E.FAULT(f"failed during {ramp.knob} = {value:g} {ramp.unit}", data))


def step_failures(tally: BaselineTally | None) -> str:
    """What the running step's requests got, for the wall-clock stop's line: never "nothing had
    failed" over requests the server refused (a 400 for the context length is a failure too)."""
    if tally is None or tally.sent == 0:
        return "nothing had failed (no request of the step had ended yet)"
    return tally.failures("of its") if tally.failed else "nothing had failed"


__all__ = ["say_failure", "step_failures"]
