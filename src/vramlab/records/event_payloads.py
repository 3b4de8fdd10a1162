"""The typed `data` of each event kind (records/events.py maps every `EventKind` to one of these).
Every key is optional: rows written by older versions lack keys added since, so readers use `.get`."""

from __future__ import annotations

from typing import Any, TypedDict


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
    client_lag: list[ClientLagData]  # per load process


class ClientLagData(TypedDict, total=False):
    """One load process's self-check in a window (PhaseEndData.client_lag)."""

    name: str
    worker: int
    pid: int
    dispatch_lag_p99_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    saturated: bool


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
    plan_field: str  # a warning about the plan: the field it is about ("rounds": too few rounds)


class HealthPathData(TypedDict, total=False):
    path: str
    answers: dict[str, str]  # each path tried and what it answered


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
    oom_killed: bool | None  # None: the kernel's count could not be read
    detail: str


# "class" is a keyword: the functional form. The log signature's name, class, severity and engine.
LogFindingData = TypedDict(
    "LogFindingData",
    {"signature": str, "class": str, "severity": str, "engine": str | None, "details": dict[str, Any]},
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


class SearchProbeData(TypedDict, total=False):
    step: int
    variable: str
    value: float
    slo: dict[str, float]
    requests: int
    duration_s: float
    throughput_rps: float
    observed: dict[str, float | None]
    failed: list[str]  # the limits it broke, "too_few_requests", "saturated"
    meets: bool
    unstable: bool  # its halves disagreed: probed again at the same value


class SearchResultData(TypedDict, total=False):
    variable: str
    answer: float | None  # the largest value that met the SLO (None: not even the lowest)
    bracket: list[float | None]  # [answer, the smallest value that did not]
    slo: dict[str, float]
    probes: int
    reason: str
