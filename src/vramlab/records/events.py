"""The event kinds: every timeline row and data event a run emits, and the typed `data` of each.

The runners, the drill, the samplers' timeline events and `vramlab note` produce them
(`vramlab.run.events.Event`, stored as `EventRecord`); the analysis and the reports read
them back through `EventKind` and the accessors below instead of string literals. `EventKind` is
a str enum: a member equals its string, so rows stored before it existed read unchanged, and an
`Event` of a kind that is not a member is refused (a bug, exit 70) so no kind goes undocumented.

Each kind's `data` is a `TypedDict` (`PAYLOADS` maps kind to type). Every key is optional: rows
written by older versions lack keys added since, so readers use `.get`. The table in
docs/store-and-reports.md ("Event kinds") is this module in words; a test keeps them equal.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol, TypedDict, cast


class EventKind(str, Enum):
    """One member per kind; `doc` says when it is emitted and what its data holds."""

    doc: str
    _value_: str

    def __new__(cls, value: str, doc: str) -> EventKind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.doc = doc
        return member

    def __str__(self) -> str:  # the plain string in f-strings and str() on every Python (as StrEnum)
        return self._value_

    # -- every run (experiment and drill) --------------------------------------------------------
    RUN_START = "run_start", "the run began; payload: its RunRecord (stored as the run row, no data)"
    RUN_END = (
        "run_end",
        "the run ended: status, ended_at (epoch s), stop_reason; requests, errors (experiment)",
    )
    PHASE_START = "phase_start", "a window began: variable, value (experiment); phase (drill, colocation)"
    PHASE_END = (
        "phase_end",
        (
            "a window ended: variable, value, requests, errors, p50_e2e_ms, p95_e2e_ms, "
            "dispatch_lag_p99_ms, client_saturated, client_lag (experiment)"
        ),
    )
    STEP = "step", "a drill's ramp step began: step (index), value, knob"
    STOP_CONDITION = "stop_condition", "a stop condition fired: condition, value, threshold"
    ROLLBACK = (
        "rollback",
        "a rollback or target-restore step ran: command, ok, exit_code, duration_s, output_tail",
    )
    NOTE = "note", "a run note, or an operator's `vramlab note`: by, at (epoch s)"
    WARNING = (
        "warning",
        (
            "something the reader should know: the client fell behind (dispatch_lag_p99_ms, "
            "loop_lag_p99_ms, client_saturated, worker, pid), a failed restart (action, issued_s)"
        ),
    )
    ERROR = "error", "the run failed (its store refused rows, an unexpected error); no data"
    # -- a drill's target and its capacity ---------------------------------------------------------
    TARGET_START = "target_start", "the drill starts its target (sim, process, container); no data"
    HEALTH_PATH = "health_path", "which health path answered: path, answers"
    TARGET_READY = "target_ready", "the target answered health 200: load_time_s"
    COTENANT = "cotenant", "a co-tenant holds GPU memory: bytes"
    COTENANT_OOM = "cotenant_oom", "the co-tenant could not grow to a step's size: value"
    CAPACITY = (
        "capacity",
        (
            "the drill's own capacity account: predicted_limit (ramp unit), activation_peak_bytes, "
            "max_num_batched_tokens, free_bytes, kv_cache_tokens, fit_tokens, kv_concurrency"
        ),
    )
    CAPACITY_PLAN = (
        "capacity_plan",
        "the capacity plan for the target's settings: facts, estimate (plan --json)",
    )
    STARTUP_MEMORY = "startup_memory", "check-log's parse of the target's start-up log: source, observation"
    # -- a drill's failure and recovery ------------------------------------------------------------
    CEILING = "ceiling", "the ramp ended without a failure: value, unit"
    STOPPED = (
        "stopped",
        "the drill ended early, no verdict: reason (no_load, baseline) or value, last_completed, unit",
    )
    DETECT = "detect", "the drill detected the failure: condition, source"
    FAULT = (
        "fault",
        (
            "the failure, once per round: step, value, knob, unit, step_started_s, t0_s, "
            "last_safe_value, mode, evidence, signature"
        ),
    )
    RAMP_UNDONE = "ramp_undone", "the load went back to the baseline for recovery: value (None)"
    MITIGATION = (
        "mitigation",
        "a corrective action: action, by, and for a restart reason, issued_s, stopped_by, "
        "startup_allowance_s",
    )
    RECOVERY_COMMAND = "recovery_command", "the plan's recovery command ran: exit_code, output (tail)"
    WAITING_FOR_OPERATOR = "waiting_for_operator", "manual recovery: the drill waits for notes: mode"
    RECOVERED = "recovered", "a request succeeded again after the failure: served_again_s"
    NOT_RECOVERED = "not_recovered", "no recovery within the limit: limit_s"
    FAILURE_MODE = "failure_mode", "the failure mode settled after recovery: mode, evidence, signature"
    RETRY_STORM = (
        "retry_storm",
        "the attempt rate ran above the baseline's during recovery: amplification, window_s",
    )
    ALERT = "alert", "an alert changed state: name, state, source, severity, owner, for, t_s"
    HEALTH = "health", "the target's health check flipped: ok"
    PROCESS_EXIT = "process_exit", "the target's process exited: exit_code, oom_killed, detail"
    # -- the target's log, as the drill's detector read it (one row per burst) ---------------------
    OOM = "oom", "an out-of-memory line: signature, class, severity, engine, details"
    STARTUP_REFUSAL = (
        "startup_refusal",
        "the engine refused to start: signature, class, severity, engine, details",
    )
    XID = "xid", "a GPU Xid error line: signature, class, severity, engine, details"
    PREEMPTION = (
        "preemption",
        "the engine preempted or ran short of KV cache: signature, class, severity, engine, details",
    )
    OVERLOAD = "overload", "the engine said it is overloaded: signature, class, severity, engine, details"
    # -- a colocation drill (docs/pack.md) ---------------------------------------------------------
    ENGINE = "engine", "one engine started or exited: engine, outcome, exit_code, ready_s, text, during"
    RACE = "race", "the start-up race's outcome: failed, started (engine names)"
    LEDGER = "ledger", "GPU memory after the drill: used_bytes, drill_pids_left, drill_pids"
    # -- a sampler's own timeline (Ollama's /api/ps) -----------------------------------------------
    MODEL_LOAD = "model_load", "Ollama loaded a model: model, size_bytes, size_vram_bytes, gpu_share, ..."
    MODEL_UNLOAD = (
        "model_unload",
        "Ollama unloaded a model: its figures and reason (expired, evicted, unloaded)",
    )
    MODEL_OFFLOAD = (
        "model_offload",
        "a model's GPU share changed: its figures, size_vram_before_bytes, size_before_bytes",
    )
    # -- data events: not timeline rows ------------------------------------------------------------
    REQUEST = "request", "one HTTP attempt; payload: its RequestRecord (stored as a request row)"
    SAMPLES = "samples", "observed values; payload: list[SampleRecord] (stored as sample rows)"


DATA_KINDS = frozenset({EventKind.REQUEST, EventKind.SAMPLES})


class NoData(TypedDict, total=False):
    """The kinds whose data is empty."""


class RunEndData(TypedDict, total=False):
    status: str
    ended_at: float
    stop_reason: str | None
    requests: int
    errors: int


class PhaseStartData(TypedDict, total=False):
    variable: str
    value: float
    phase: str


class PhaseEndData(TypedDict, total=False):
    variable: str
    value: float
    requests: int
    errors: int
    p50_e2e_ms: float | None
    p95_e2e_ms: float | None
    dispatch_lag_p99_ms: float | None
    client_saturated: bool
    client_lag: list[
        dict[str, Any]
    ]  # per load process: name, pid, saturated, dispatch_lag_p99_ms, loop_lag_p99_ms


class StepData(TypedDict, total=False):
    step: int
    value: float
    knob: str


class StopConditionData(TypedDict, total=False):
    condition: str
    value: float | None
    threshold: float | None


class RollbackData(TypedDict, total=False):
    command: str
    ok: bool
    exit_code: int | None
    duration_s: float
    output_tail: str


class NoteData(TypedDict, total=False):
    by: str
    at: float


class WarningData(TypedDict, total=False):
    dispatch_lag_p99_ms: float
    loop_lag_p99_ms: float
    client_saturated: bool
    worker: int
    pid: int
    action: str
    issued_s: float


class HealthPathData(TypedDict, total=False):
    path: str
    answers: list[str]


class TargetReadyData(TypedDict, total=False):
    load_time_s: float


class CotenantData(TypedDict, total=False):
    bytes: int


class ValueData(TypedDict, total=False):
    """cotenant_oom and ramp_undone: the ramp value (None: back to the baseline)."""

    value: float | None


class CapacityData(TypedDict, total=False):
    predicted_limit: float | None
    activation_peak_bytes: int
    max_num_batched_tokens: int
    free_bytes: int
    kv_cache_tokens: int
    fit_tokens: int
    kv_concurrency: float


class CapacityPlanData(TypedDict, total=False):
    facts: dict[str, Any]  # model, engine, gpu, gpu_memory_gib, engine_version, settings
    estimate: dict[str, Any]  # `vramlab plan --json` (docs/plan-json.md)


class StartupMemoryData(TypedDict, total=False):
    source: str
    observation: dict[str, Any]  # a logs.Observation as JSON


class CeilingData(TypedDict, total=False):
    value: float
    unit: str


class StoppedData(TypedDict, total=False):
    reason: str
    value: float
    last_completed: float | None
    unit: str


class DetectData(TypedDict, total=False):
    condition: str
    source: str


class FaultData(TypedDict, total=False):
    step: int
    value: float
    knob: str
    unit: str
    step_started_s: float
    t0_s: float
    last_safe_value: float | None
    mode: str
    evidence: list[str]
    signature: (
        dict[str, Any] | None
    )  # the matched log line: signature, class, severity, engine, details, line, t_s


class MitigationData(TypedDict, total=False):
    action: str  # restart, script, operator
    by: str  # supervisor, script, operator
    reason: str
    issued_s: float
    stopped_by: str | None
    startup_allowance_s: float


class RecoveryCommandData(TypedDict, total=False):
    exit_code: int
    output: str


class ModeData(TypedDict, total=False):
    mode: str


class RecoveredData(TypedDict, total=False):
    served_again_s: float | None


class NotRecoveredData(TypedDict, total=False):
    limit_s: float


class FailureModeData(TypedDict, total=False):
    mode: str
    evidence: list[str]
    signature: (
        dict[str, Any] | None
    )  # the matched log line: signature, class, severity, engine, details, line, t_s


class RetryStormData(TypedDict, total=False):
    amplification: float
    window_s: float


# "for" is a keyword: the functional form
AlertData = TypedDict(
    "AlertData",
    {
        "name": str,
        "state": str,
        "source": str,
        "severity": str | None,
        "owner": str | None,
        "for": str,
        "t_s": float,
    },
    total=False,
)


class HealthData(TypedDict, total=False):
    ok: bool


class ProcessExitData(TypedDict, total=False):
    exit_code: int | None
    oom_killed: bool
    detail: str


# "class" is a keyword: the functional form. The log signature's name, class, severity and engine.
LogFindingData = TypedDict(
    "LogFindingData",
    {"signature": str, "class": str, "severity": str, "engine": str, "details": dict[str, Any]},
    total=False,
)


class EngineData(TypedDict, total=False):
    engine: str
    outcome: str
    exit_code: int | None
    ready_s: float | None
    text: str
    during: str


class RaceData(TypedDict, total=False):
    failed: list[str]
    started: list[str]


class LedgerData(TypedDict, total=False):
    used_bytes: int | None
    drill_pids_left: list[int]
    drill_pids: list[int]


class OllamaModelData(TypedDict, total=False):
    model: str
    size_bytes: int
    size_vram_bytes: int
    gpu_share: float
    context_length: int
    expires_at: str
    already_loaded: bool  # model_load: it was loaded before sampling began
    reason: str  # model_unload: expired, evicted, unloaded
    size_vram_before_bytes: int  # model_offload
    size_before_bytes: int  # model_offload


K = EventKind
PAYLOADS: dict[EventKind, type] = {
    K.RUN_START: NoData,
    K.RUN_END: RunEndData,
    K.PHASE_START: PhaseStartData,
    K.PHASE_END: PhaseEndData,
    K.STEP: StepData,
    K.STOP_CONDITION: StopConditionData,
    K.ROLLBACK: RollbackData,
    K.NOTE: NoteData,
    K.WARNING: WarningData,
    K.ERROR: NoData,
    K.TARGET_START: NoData,
    K.HEALTH_PATH: HealthPathData,
    K.TARGET_READY: TargetReadyData,
    K.COTENANT: CotenantData,
    K.COTENANT_OOM: ValueData,
    K.CAPACITY: CapacityData,
    K.CAPACITY_PLAN: CapacityPlanData,
    K.STARTUP_MEMORY: StartupMemoryData,
    K.CEILING: CeilingData,
    K.STOPPED: StoppedData,
    K.DETECT: DetectData,
    K.FAULT: FaultData,
    K.RAMP_UNDONE: ValueData,
    K.MITIGATION: MitigationData,
    K.RECOVERY_COMMAND: RecoveryCommandData,
    K.WAITING_FOR_OPERATOR: ModeData,
    K.RECOVERED: RecoveredData,
    K.NOT_RECOVERED: NotRecoveredData,
    K.FAILURE_MODE: FailureModeData,
    K.RETRY_STORM: RetryStormData,
    K.ALERT: AlertData,
    K.HEALTH: HealthData,
    K.PROCESS_EXIT: ProcessExitData,
    K.OOM: LogFindingData,
    K.STARTUP_REFUSAL: LogFindingData,
    K.XID: LogFindingData,
    K.PREEMPTION: LogFindingData,
    K.OVERLOAD: LogFindingData,
    K.ENGINE: EngineData,
    K.RACE: RaceData,
    K.LEDGER: LedgerData,
    K.MODEL_LOAD: OllamaModelData,
    K.MODEL_UNLOAD: OllamaModelData,
    K.MODEL_OFFLOAD: OllamaModelData,
    K.REQUEST: NoData,
    K.SAMPLES: NoData,
}


def payload_keys(kind: EventKind) -> frozenset[str]:
    """The data keys a kind's payload type declares."""
    t: Any = PAYLOADS[kind]
    return frozenset(t.__required_keys__ | t.__optional_keys__)


class HasData(Protocol):
    """An `Event` or an `EventRecord`."""

    @property
    def kind(self) -> str: ...

    @property
    def data(self) -> dict[str, Any]: ...


def _data(ev: HasData, *kinds: EventKind) -> dict[str, Any]:
    if ev.kind not in kinds:  # a reader's bug: it picked the wrong row
        raise ValueError(f"a {str(ev.kind)!r} event read as {' or '.join(map(str, kinds))}")
    return ev.data


# The typed reads the analysis and the reports use (one per kind they read the data of).
def phase_start_data(ev: HasData) -> PhaseStartData:
    return cast(PhaseStartData, _data(ev, K.PHASE_START))


def phase_end_data(ev: HasData) -> PhaseEndData:
    return cast(PhaseEndData, _data(ev, K.PHASE_END))


def step_data(ev: HasData) -> StepData:
    return cast(StepData, _data(ev, K.STEP))


def warning_data(ev: HasData) -> WarningData:
    return cast(WarningData, _data(ev, K.WARNING))


def note_data(ev: HasData) -> NoteData:
    return cast(NoteData, _data(ev, K.NOTE))


def capacity_data(ev: HasData) -> CapacityData:
    return cast(CapacityData, _data(ev, K.CAPACITY))


def capacity_plan_data(ev: HasData) -> CapacityPlanData:
    return cast(CapacityPlanData, _data(ev, K.CAPACITY_PLAN))


def startup_memory_data(ev: HasData) -> StartupMemoryData:
    return cast(StartupMemoryData, _data(ev, K.STARTUP_MEMORY))


def ceiling_data(ev: HasData) -> CeilingData:
    return cast(CeilingData, _data(ev, K.CEILING))


def fault_data(ev: HasData) -> FaultData:
    return cast(FaultData, _data(ev, K.FAULT))


def failure_mode_data(ev: HasData) -> FailureModeData:
    return cast(FailureModeData, _data(ev, K.FAILURE_MODE))


def retry_storm_data(ev: HasData) -> RetryStormData:
    return cast(RetryStormData, _data(ev, K.RETRY_STORM))


def alert_data(ev: HasData) -> AlertData:
    return cast(AlertData, _data(ev, K.ALERT))


def engine_data(ev: HasData) -> EngineData:
    return cast(EngineData, _data(ev, K.ENGINE))


def race_data(ev: HasData) -> RaceData:
    return cast(RaceData, _data(ev, K.RACE))


def ledger_data(ev: HasData) -> LedgerData:
    return cast(LedgerData, _data(ev, K.LEDGER))


def check_kind(kind: str) -> EventKind:
    """The member for *kind*; an unknown kind is a producer's bug (ValueError, exit 70)."""
    member = _BY_VALUE.get(kind)
    if member is None:
        raise ValueError(f"unknown event kind {kind!r}: add it to vramlab.records.events.EventKind")
    return member


_BY_VALUE = {k.value: k for k in EventKind}
