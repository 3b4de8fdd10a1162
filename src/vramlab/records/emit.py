"""What a writer hands the runner: a `Draft` of one event, made by its kind's typed constructor.

Each event kind has one `Emit` here, bound to the `TypedDict` its data is declared as
(records/event_payloads.py), so mypy checks every writer's payload where it is written:
``run.emit(E.FAULT("failed during ...", {"step": 3, "mode": "crash"}))`` with a key the kind does
not declare, or a value of the wrong type, is a type error. The kinds that carry a record instead of
data have their own constructors (`run_start`, `request`, `samples`). `PAYLOADS` is derived from the
constructors: one table. The runner stamps a draft with its clock and position (run/runner.py);
``VRAMLAB_STRICT_EVENTS`` adds the same check at run time (records/event_check.py), for what mypy
cannot see (a value read from a file or a sampler).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from vramlab.records import RequestRecord, RunRecord, SampleRecord
from vramlab.records import event_payloads as P
from vramlab.records.events import EventKind

D = TypeVar("D", bound=Mapping[str, object])
Payload = RunRecord | RequestRecord | list[SampleRecord] | None  # the data kinds' records
Emitter = Callable[["Draft"], None]  # what a writer is handed: `Runner.emit`


@dataclass(frozen=True)
class Draft:
    """One event before the runner stamps it (time, round, phase, step)."""

    kind: EventKind
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)  # its kind's TypedDict, checked where it was made
    payload: Payload = None


class Emit(Generic[D]):
    """The constructor of one kind's drafts: its data must be the kind's declared `TypedDict`."""

    def __init__(self, kind: EventKind, data_type: type[D]) -> None:
        self.kind, self.data_type = kind, data_type

    def __call__(self, message: str = "", data: D | None = None) -> Draft:
        return Draft(self.kind, message, data if data is not None else {})

    def __repr__(self) -> str:
        return f"Emit({self.kind.value}, {self.data_type.__name__})"


K = EventKind
RUN_END: Final = Emit(K.RUN_END, P.RunEndData)
PHASE_START: Final = Emit(K.PHASE_START, P.PhaseStartData)
PHASE_END: Final = Emit(K.PHASE_END, P.PhaseEndData)
STEP: Final = Emit(K.STEP, P.StepData)
STOP_CONDITION: Final = Emit(K.STOP_CONDITION, P.StopConditionData)
ROLLBACK: Final = Emit(K.ROLLBACK, P.RollbackData)
NOTE: Final = Emit(K.NOTE, P.NoteData)
WARNING: Final = Emit(K.WARNING, P.WarningData)
ERROR: Final = Emit(K.ERROR, P.NoData)
TARGET_START: Final = Emit(K.TARGET_START, P.NoData)
HEALTH_PATH: Final = Emit(K.HEALTH_PATH, P.HealthPathData)
TARGET_READY: Final = Emit(K.TARGET_READY, P.TargetReadyData)
COTENANT: Final = Emit(K.COTENANT, P.CotenantData)
COTENANT_OOM: Final = Emit(K.COTENANT_OOM, P.ValueData)
CAPACITY: Final = Emit(K.CAPACITY, P.CapacityData)
CAPACITY_PLAN: Final = Emit(K.CAPACITY_PLAN, P.CapacityPlanData)
STARTUP_MEMORY: Final = Emit(K.STARTUP_MEMORY, P.StartupMemoryData)
CEILING: Final = Emit(K.CEILING, P.CeilingData)
STOPPED: Final = Emit(K.STOPPED, P.StoppedData)
DETECT: Final = Emit(K.DETECT, P.DetectData)
FAULT: Final = Emit(K.FAULT, P.FaultData)
RAMP_UNDONE: Final = Emit(K.RAMP_UNDONE, P.ValueData)
MITIGATION: Final = Emit(K.MITIGATION, P.MitigationData)
RECOVERY_COMMAND: Final = Emit(K.RECOVERY_COMMAND, P.RecoveryCommandData)
WAITING_FOR_OPERATOR: Final = Emit(K.WAITING_FOR_OPERATOR, P.ModeData)
RECOVERED: Final = Emit(K.RECOVERED, P.RecoveredData)
NOT_RECOVERED: Final = Emit(K.NOT_RECOVERED, P.NotRecoveredData)
FAILURE_MODE: Final = Emit(K.FAILURE_MODE, P.FailureModeData)
RETRY_STORM: Final = Emit(K.RETRY_STORM, P.RetryStormData)
ALERT: Final = Emit(K.ALERT, P.AlertData)
HEALTH: Final = Emit(K.HEALTH, P.HealthData)
PROCESS_EXIT: Final = Emit(K.PROCESS_EXIT, P.ProcessExitData)
OOM: Final = Emit(K.OOM, P.LogFindingData)
STARTUP_REFUSAL: Final = Emit(K.STARTUP_REFUSAL, P.LogFindingData)
XID: Final = Emit(K.XID, P.LogFindingData)
PREEMPTION: Final = Emit(K.PREEMPTION, P.LogFindingData)
OVERLOAD: Final = Emit(K.OVERLOAD, P.LogFindingData)
ENGINE: Final = Emit(K.ENGINE, P.EngineData)
RACE: Final = Emit(K.RACE, P.RaceData)
LEDGER: Final = Emit(K.LEDGER, P.LedgerData)
MODEL_LOAD: Final = Emit(K.MODEL_LOAD, P.OllamaModelData)
MODEL_UNLOAD: Final = Emit(K.MODEL_UNLOAD, P.OllamaModelData)
MODEL_OFFLOAD: Final = Emit(K.MODEL_OFFLOAD, P.OllamaModelData)
SEARCH_PROBE: Final = Emit(K.SEARCH_PROBE, P.SearchProbeData)
SEARCH_RESULT: Final = Emit(K.SEARCH_RESULT, P.SearchResultData)
# the kinds that carry a record, not data
_RUN_START: Final = Emit(K.RUN_START, P.NoData)
_REQUEST: Final = Emit(K.REQUEST, P.NoData)
_SAMPLES: Final = Emit(K.SAMPLES, P.NoData)


def run_start(message: str, record: RunRecord) -> Draft:
    """The run began; its record is stored as the run row."""
    return Draft(K.RUN_START, message, {}, record)


def request(record: RequestRecord) -> Draft:
    """One HTTP attempt, stored as a request row."""
    return Draft(K.REQUEST, "", {}, record)


def samples(records: list[SampleRecord]) -> Draft:
    """Observed values, stored as sample rows."""
    return Draft(K.SAMPLES, "", {}, records)


_ALL: tuple[Emit[Any], ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Emit))
PAYLOADS: dict[EventKind, type] = {e.kind: e.data_type for e in _ALL}
"""The `TypedDict` each kind's data is declared as (every kind has one: a test keeps it so)."""


def payload_keys(kind: EventKind) -> frozenset[str]:
    """The data keys a kind's payload type declares."""
    t: Any = PAYLOADS[kind]
    return frozenset(t.__required_keys__ | t.__optional_keys__)
