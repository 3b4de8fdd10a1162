"""The event kinds: every timeline row and data event a run emits, and the typed `data` of each.

The runners, the drill, the samplers' timeline events and `vramlab note` produce them
(`vramlab.run.events.Event`, stored as `EventRecord`); the analysis and the reports read
them back through `EventKind` and the accessors below instead of string literals. `EventKind` is
a str enum: a member equals its string, so rows stored before it existed read unchanged, and an
`Event` of a kind that is not a member is refused (a bug, exit 70) so no kind goes undocumented.

Each kind's `data` is a `TypedDict` (records/event_payloads.py); a writer makes it with its kind's typed
constructor (records/emit.py, where `PAYLOADS` maps kind to type).
Every key is optional: rows written by older versions lack keys added since, so readers use `.get`. The table in
docs/store-and-reports.md ("Event kinds") is this module in words; a test keeps them equal.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol, cast

from vramlab.records import event_payloads as P


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
            "loop_lag_p99_ms, client_saturated, worker, pid), a failed restart (action, issued_s), "
            "a plan's field (plan_field)"
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
    # -- an SLO search (docs/experiments.md) ------------------------------------------------------
    SEARCH_PROBE = (
        "search_probe",
        "one probe of an SLO search: step, variable, value, slo, observed, failed, meets, throughput_rps",
    )
    SEARCH_RESULT = "search_result", "the SLO search's answer: variable, answer, bracket, slo, probes, reason"
    # -- data events: not timeline rows ------------------------------------------------------------
    REQUEST = "request", "one HTTP attempt; payload: its RequestRecord (stored as a request row)"
    SAMPLES = "samples", "observed values; payload: list[SampleRecord] (stored as sample rows)"


DATA_KINDS = frozenset({EventKind.REQUEST, EventKind.SAMPLES})


K = EventKind


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
def phase_start_data(ev: HasData) -> P.PhaseStartData:
    return cast(P.PhaseStartData, _data(ev, K.PHASE_START))


def phase_end_data(ev: HasData) -> P.PhaseEndData:
    return cast(P.PhaseEndData, _data(ev, K.PHASE_END))


def step_data(ev: HasData) -> P.StepData:
    return cast(P.StepData, _data(ev, K.STEP))


def warning_data(ev: HasData) -> P.WarningData:
    return cast(P.WarningData, _data(ev, K.WARNING))


def note_data(ev: HasData) -> P.NoteData:
    return cast(P.NoteData, _data(ev, K.NOTE))


def capacity_data(ev: HasData) -> P.CapacityData:
    return cast(P.CapacityData, _data(ev, K.CAPACITY))


def capacity_plan_data(ev: HasData) -> P.CapacityPlanData:
    return cast(P.CapacityPlanData, _data(ev, K.CAPACITY_PLAN))


def startup_memory_data(ev: HasData) -> P.StartupMemoryData:
    return cast(P.StartupMemoryData, _data(ev, K.STARTUP_MEMORY))


def ceiling_data(ev: HasData) -> P.CeilingData:
    return cast(P.CeilingData, _data(ev, K.CEILING))


def fault_data(ev: HasData) -> P.FaultData:
    return cast(P.FaultData, _data(ev, K.FAULT))


def failure_mode_data(ev: HasData) -> P.FailureModeData:
    return cast(P.FailureModeData, _data(ev, K.FAILURE_MODE))


def retry_storm_data(ev: HasData) -> P.RetryStormData:
    return cast(P.RetryStormData, _data(ev, K.RETRY_STORM))


def alert_data(ev: HasData) -> P.AlertData:
    return cast(P.AlertData, _data(ev, K.ALERT))


def engine_data(ev: HasData) -> P.EngineData:
    return cast(P.EngineData, _data(ev, K.ENGINE))


def race_data(ev: HasData) -> P.RaceData:
    return cast(P.RaceData, _data(ev, K.RACE))


def ledger_data(ev: HasData) -> P.LedgerData:
    return cast(P.LedgerData, _data(ev, K.LEDGER))


def search_probe_data(ev: HasData) -> P.SearchProbeData:
    return cast(P.SearchProbeData, _data(ev, K.SEARCH_PROBE))


def search_result_data(ev: HasData) -> P.SearchResultData:
    return cast(P.SearchResultData, _data(ev, K.SEARCH_RESULT))


def check_kind(kind: str) -> EventKind:
    """The member for *kind*; an unknown kind is a producer's bug (ValueError, exit 70)."""
    member = _BY_VALUE.get(kind)
    if member is None:
        raise ValueError(f"unknown event kind {kind!r}: add it to vramlab.records.events.EventKind")
    return member


_BY_VALUE = {k.value: k for k in EventKind}
