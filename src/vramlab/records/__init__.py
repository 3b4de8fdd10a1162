"""The record contract between the runner (producer), the store and the reports (consumers).

The bottom of the run side: this package imports nothing of vramlab's but `vramlab.errors`, and
experiment, drill, store, analysis and report all depend on it instead of on each other. The
`Store` port is in `vramlab.records.store`, an in-memory store in `vramlab.records.memory`, the
event kinds and their typed data in `vramlab.records.events`.

Four pydantic models, one per kind of stored row. The runner and the drill build them; the store
persists them as they are; analysis and reports read them back. Times are float seconds, bytes are
ints, latencies carry their unit in the name. The contract only grows: a new field always has a
default, so older rows and older producers keep working.

RunRecord (one per run)

| field | type | meaning |
|---|---|---|
| run_id | str | 8 lowercase hex chars (`new_run_id()`) |
| kind | "experiment" \\| "drill" | what produced the run |
| name | str | the plan's name |
| plan | dict | the plan document as loaded, API keys and secret env values removed |
| plan_hash | str | sha256 of the canonical fixed part (`canonical_sha256`) |
| fixed | dict | captured environment: engine, engine_version, model, gpu_name, driver, vramlab_version, host, python |
| target | dict | base_url, api flavour, environment (never the key) |
| change | dict | the one variable and its steps |
| started_at / ended_at | float / float \\| None | epoch seconds; ended_at None while running |
| status | "running" \\| "completed" \\| "stopped" \\| "failed" \\| "interrupted" | |
| stop_reason | str \\| None | why a stop condition or error ended the run |
| notes | list[str] | one line each (missing sampler, fewer rounds than 3, ...) |

RequestRecord (one per HTTP attempt)

| field | type | meaning |
|---|---|---|
| run_id, round, phase, step, step_value | | where it ran; phase is baseline/treatment/recovery/ramp |
| request_id, attempt | str, int | attempt 0 is the first try |
| scheduled_s, sent_s, first_token_s, end_s | float \\| None | seconds from run start; None when absent |
| ttft_ms, tpot_ms, e2e_ms | float \\| None | measured from the actual send |
| ttft_from_scheduled_ms, e2e_from_scheduled_ms | float \\| None | measured from the scheduled send (coordinated omission) |
| dispatch_lag_ms | float \\| None | sent_s - scheduled_s: how far the client fell behind |
| itl_ms | list[float] | inter-token latencies: every gap between two token chunks whose arrival times are both known |
| itl_untimed_gaps | int \\| None | gaps between token chunks left out of itl_ms: a token read together with later bytes has no arrival time of its own; None = not recorded (rows from before schema 4) |
| prompt_tokens, output_tokens | int \\| None | output_tokens: content and reasoning together |
| prompt_tokens_source | str \\| None | "usage" (the server's count), "tokenizer" (the prompt counted in the target's tokenizer before it was sent), "estimate" (one token a word) or "input" (the input file's figure); None = unknown (rows from before schema 5) |
| output_tokens_source | str \\| None | "usage" (the server's count), "timings" (llama.cpp's own count in its last chunk) or "chunks" (counted stream chunks: an estimate) |
| reasoning_tokens | int \\| None | of output_tokens, reasoning (`reasoning_content` / `reasoning` deltas; usage's reasoning_tokens when sent) |
| cached_tokens | int \\| None | prompt tokens the engine's prefix cache served, in its words (usage's prompt_tokens_details.cached_tokens, llama-server's timings.cache_n); None = not said (schema 6) |
| conversation, turn, tenant | str \\| None, int \\| None, str \\| None | a conversation workload's request: which conversation, its turn (1-based) and the tenant it belongs to; None otherwise (schema 6) |
| status_code | int | 0 = no HTTP response |
| error_class | str \\| None | timeout, connect, http_4xx, http_5xx, oom, stream_broken, cancelled |
| error | str \\| None | short text, no secrets |

SampleRecord (one per observed value)

| field | type | meaning |
|---|---|---|
| run_id, t_s | str, float | t_s in seconds from run start |
| source | gpu \\| ledger \\| engine \\| prometheus \\| host \\| health \\| ollama | |
| name | str | e.g. gpu.memory_used_bytes, engine.kv_cache_usage_perc, engine.num_requests_waiting |
| value | float | |
| labels | dict[str, str] | e.g. {"gpu": "0"} |

EventRecord (the run's timeline)

| field | type | meaning |
|---|---|---|
| run_id, t_s | str, float | t_s in seconds from run start |
| kind | str | an `EventKind` (vramlab.records.events: every kind, each with a typed data): run_start, phase_start, phase_end, step, stop_condition, rollback, note, warning, oom, alert, recovered, error, ... |
| round, phase, step | int \\| None, str \\| None, int \\| None | where in the plan it happened |
| message | str | one line for humans |
| data | dict | JSON-serialisable details |
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

RunKind = Literal["experiment", "drill"]
RunStatus = Literal["running", "completed", "stopped", "failed", "interrupted"]
Phase = Literal["baseline", "treatment", "recovery", "ramp"]
SampleSource = Literal["gpu", "ledger", "engine", "prometheus", "host", "health", "ollama"]

PHASES: tuple[str, ...] = ("baseline", "treatment", "recovery", "ramp")
RUN_STATUSES: tuple[str, ...] = ("running", "completed", "stopped", "failed", "interrupted")
ERROR_CLASSES: tuple[str, ...] = (
    "timeout",
    "connect",
    "http_4xx",
    "http_5xx",
    "oom",
    "stream_broken",
    "cancelled",
)


def new_run_id() -> str:
    """A fresh 8-hex-char run id."""
    return secrets.token_hex(4)


def canonical_sha256(obj: Any) -> str:
    """sha256 of a JSON document with sorted keys and no whitespace: equal content, equal hash."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class _Record(BaseModel):
    # forbid: a misspelt field from a producer fails loudly instead of vanishing.
    model_config = ConfigDict(extra="forbid")


class RunRecord(_Record):
    run_id: str = Field(pattern=r"^[0-9a-f]{8}$")
    kind: RunKind = "experiment"
    name: str
    plan: dict[str, Any] = Field(default_factory=dict)
    plan_hash: str = ""
    fixed: dict[str, Any] = Field(default_factory=dict)
    target: dict[str, Any] = Field(default_factory=dict)
    change: dict[str, Any] = Field(default_factory=dict)
    started_at: float
    ended_at: float | None = None
    status: RunStatus = "running"
    stop_reason: str | None = None
    notes: list[str] = Field(default_factory=list)


class RequestRecord(_Record):
    run_id: str
    round: int
    phase: Phase
    step: int = 0
    step_value: float | None = None
    request_id: str
    attempt: int = 0
    scheduled_s: float | None = None
    sent_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    e2e_from_scheduled_ms: float | None = None
    ttft_from_scheduled_ms: float | None = None
    dispatch_lag_ms: float | None = None
    itl_ms: list[float] = Field(default_factory=list)
    itl_untimed_gaps: int | None = None
    prompt_tokens: int | None = None
    prompt_tokens_source: str | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    reasoning_tokens: int | None = None
    status_code: int = 0
    error_class: str | None = None
    error: str | None = None
    cached_tokens: int | None = None
    conversation: str | None = None
    turn: int | None = None
    tenant: str | None = None

    @property
    def ok(self) -> bool:
        """A success: an HTTP 2xx and no error class."""
        return self.error_class is None and 200 <= self.status_code < 300


class SampleRecord(_Record):
    run_id: str
    t_s: float
    source: SampleSource
    name: str
    value: float
    labels: dict[str, str] = Field(default_factory=dict)


class EventRecord(_Record):
    run_id: str
    t_s: float
    kind: str
    round: int | None = None
    phase: str | None = None
    step: int | None = None
    message: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


__all__ = [
    "ERROR_CLASSES",
    "PHASES",
    "RUN_STATUSES",
    "EventRecord",
    "RequestRecord",
    "RunRecord",
    "SampleRecord",
    "canonical_sha256",
    "new_run_id",
]
