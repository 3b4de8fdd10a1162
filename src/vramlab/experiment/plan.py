"""The experiment plan: a YAML document, validated, never mutated.

A plan fixes the inputs and the target, names the one variable that changes, and says how long
each phase watches, how many rounds to repeat, what to stop on and how to roll back. Errors point
at the file, line and field: ``plan.yaml:12: change.steps: ...``. The reference is
docs/experiments.md.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vramlab.engines import EngineName
from vramlab.errors import ConfigError
from vramlab.experiment.plan_change import Search, Soak
from vramlab.experiment.plan_conversations import Conversations
from vramlab.plandoc import (
    CapacityFacts,
    PlanDocument,
    Retry,
    RollbackCommand,
    SimSettings,
    StopConditions,
    metrics_endpoint,
    rollback_strings,
    sim_with_model,
)

Variable = Literal["concurrency", "request_rate", "prompt_tokens", "output_tokens"]
SamplerSource = Literal["gpu", "ledger", "engine", "prometheus", "host", "health", "ollama"]
# Threshold names the analysis understands: a statistic of a per-request latency, or a rate.
_METRIC_NAME = re.compile(
    r"^(p50|p90|p95|p99|max|mean)_(ttft|tpot|itl|e2e)_ms$|^error_rate$|^min_goodput_rps$"
)
MAX_RAMP_STEPS = 64
RUN_SIM_SPEED = 20.0  # a run's target.sim.speed when the plan leaves it out (docs/experiments.md)


class _Model(BaseModel):
    # frozen + forbid: a plan is a document; a typo must fail loudly, and nobody may edit it after loading.
    # allow_inf_nan=False: `duration_s: .inf` or `.nan` is refused with the field's name, not run until the wall clock.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Target(_Model):
    base_url: str | None = Field(
        default=None, description="the endpoint; filled in by vramlab when target.sim is given"
    )
    api: Literal["openai-chat", "openai-completions"] = "openai-chat"
    model: str
    api_key_env: str | None = None
    metrics_url: str | None = Field(
        default=None,
        description="the Prometheus text endpoint: a URL, or a path on the target's root (default /metrics)",
    )
    health_url: str | None = None
    # every engine of the registry (vramlab.engines), the rehearsal server, "other" for anything else
    kind: EngineName | Literal["sim", "other"] = "other"
    environment: Literal["test", "staging", "production"] = "test"
    pid: int | None = Field(default=None, description="the target process, for its RSS (same host only)")
    sim: SimSettings | None = Field(
        default=None, description="start a sim for this run (kind: sim, no base_url)"
    )
    log_file: str | None = Field(
        default=None, description="the target's log: its start-up memory lines are read"
    )

    @model_validator(mode="before")
    @classmethod
    def _sim_for_a_run(cls, data: Any) -> Any:
        # The sim serves the model the requests name, unless target.sim.model says otherwise; a run's
        # sim keeps the pace runs always had (speed 20, where SimSettings' own default is a drill's 50).
        if isinstance(data, dict) and isinstance(data.get("sim"), dict):
            return {**data, "sim": {"speed": RUN_SIM_SPEED, **sim_with_model(data["sim"], data.get("model"))}}
        return data

    @model_validator(mode="after")
    def _where(self) -> Target:
        if self.sim is not None and self.kind != "sim":
            raise ValueError("sim: settings need kind: sim")
        if self.sim is None and self.base_url is None:
            raise ValueError(
                "give base_url (the endpoint), or kind: sim with sim: {gpu: ...} to let vramlab "
                "start a rehearsal server"
            )
        return self

    @property
    def url(self) -> str:
        """The endpoint (known once the run's own sim, if any, is up)."""
        if self.base_url is None:
            raise ValueError("target.base_url is not known yet (the run's sim has not started)")
        return self.base_url

    def metrics_endpoint(self, root: str) -> str:
        """The Prometheus text endpoint: metrics_url as given, or as a path on *root*."""
        return metrics_endpoint(self.metrics_url, root)

    @field_validator("metrics_url")
    @classmethod
    def _url_or_path(cls, v: str | None) -> str | None:
        return v if v is None or v.startswith("/") else cls._http(v)

    @field_validator("base_url", "health_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
        return v.rstrip("/") if v else v

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        # The plan names the variable; a value that looks like a key itself is refused so it is never stored.
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(
                "must be the NAME of an environment variable (the key itself never goes in a plan)"
            )
        return v

    @model_validator(mode="after")
    def _one_credential(self) -> Target:
        # HTTP sends one Authorization header: user-info in the URL (Basic) or the key (Bearer), not both.
        if self.api_key_env and self.base_url and "@" in self.base_url.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError(
                "@base_url: has user-info (user:password@) and api_key_env is set too; "
                "give one (HTTP carries one Authorization header)"
            )
        return self


class Synthetic(_Model):
    prompt_tokens: int = Field(gt=0, le=1_000_000)
    output_tokens: int = Field(gt=0, le=1_000_000)
    seed: int = 0
    count: int = Field(default=100, gt=0, le=1_000_000)


class InputSet(_Model):
    synthetic: Synthetic | None = None
    jsonl: str | None = None
    trace: str | None = Field(
        default=None, description="a request trace replayed at its own times (load/trace.py)"
    )
    format: Literal["mooncake", "burstgpt", "jsonl"] | None = Field(
        default=None, description="the trace's format"
    )
    time_scale: float = Field(
        default=1.0, gt=0, le=1e6, description="trace times x this (0.5: twice the rate)"
    )
    max_requests: int | None = Field(
        default=None, gt=0, le=10_000_000, description="the trace's first N requests"
    )
    seed: int = Field(default=0, description="a trace's prompt text: the same seed, the same words")
    conversations: Conversations | None = Field(
        default=None, description="N conversations x T turns (experiment/plan_conversations.py)"
    )

    @model_validator(mode="after")
    def _one(self) -> InputSet:
        if sum(x is not None for x in (self.synthetic, self.jsonl, self.trace, self.conversations)) != 1:
            raise ValueError("give exactly one of 'synthetic', 'jsonl', 'trace' or 'conversations'")
        if self.trace is not None and self.format is None:
            raise ValueError("trace: needs format: mooncake, burstgpt or jsonl")
        if self.trace is None and (
            self.format is not None or self.max_requests is not None or self.time_scale != 1.0
        ):
            raise ValueError("format, time_scale and max_requests belong to a trace: (give trace: FILE)")
        return self


class Fixed(_Model):
    input: InputSet
    ignore_eos: bool = Field(default=False, description="ask the engine to always generate output_tokens")


class Ramp(_Model):
    start: float = Field(gt=0)
    factor: float = Field(gt=1)
    ceiling: float = Field(gt=0)

    @model_validator(mode="after")
    def _bounded(self) -> Ramp:
        if self.ceiling < self.start:
            raise ValueError("ceiling must be at least start")
        if math.log(self.ceiling / self.start, self.factor) > MAX_RAMP_STEPS:
            raise ValueError(f"the ramp has more than {MAX_RAMP_STEPS} steps")
        return self

    def values(self) -> list[float]:
        out, v = [], self.start
        while v <= self.ceiling * (1 + 1e-9):
            out.append(v)
            v *= self.factor
        return out


class Change(_Model):
    variable: Variable
    baseline: float | None = Field(
        default=None, gt=0, description="value in baseline and recovery; default: the load's own"
    )
    steps: list[float] | None = None
    ramp: Ramp | None = None
    search: Search | None = None  # the largest value meeting the SLO (experiment/plan_change.py)
    soak: Soak | None = None  # one long treatment window, compared window by window

    @model_validator(mode="before")
    @classmethod
    def _search_names_the_variable(cls, data: Any) -> Any:
        # `change.search: {variable: concurrency | rate, ...}` may name the variable itself
        if isinstance(data, dict) and isinstance(data.get("search"), dict) and data["search"].get("variable"):
            named = {"rate": "request_rate"}.get(data["search"]["variable"], data["search"]["variable"])
            if data.get("variable") not in (None, named):
                raise ValueError(f"search.variable {named!r} and variable {data['variable']!r} differ")
            return {**data, "variable": named, "search": {**data["search"], "variable": named}}
        return data

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[float] | None) -> list[float] | None:
        if v is not None:
            if not v:
                raise ValueError("needs at least one step")
            if any(s <= 0 for s in v):
                raise ValueError("every step must be greater than 0")
        return v

    @model_validator(mode="after")
    def _one(self) -> Change:
        if sum(x is not None for x in (self.steps, self.ramp, self.search, self.soak)) != 1:
            raise ValueError("give exactly one of 'steps', 'ramp', 'search' or 'soak'")
        if self.search is not None and self.variable not in ("concurrency", "request_rate"):
            raise ValueError("search: the variable is concurrency or request_rate")
        return self

    def values(self) -> list[float]:
        """The treatment values planned up front (a search's: its bracket's ends; a soak's one)."""
        if self.search is not None:
            return [self.search.low, self.search.high]
        if self.soak is not None:
            return [self.soak.value]
        return list(self.steps) if self.steps is not None else self.ramp.values()  # type: ignore[union-attr]


class Phases(_Model):
    """One observation window, the same for baseline, every treatment step and recovery."""

    duration_s: float | None = Field(default=None, gt=0)
    requests: int | None = Field(default=None, gt=0)
    drain_s: float = Field(
        default=5.0, ge=0, description="how long in-flight requests may finish after a window"
    )

    @model_validator(mode="after")
    def _window(self) -> Phases:
        if self.duration_s is None and self.requests is None:
            raise ValueError("give duration_s, requests or both (the window ends at whichever comes first)")
        return self


class Load(_Model):
    mode: Literal["closed", "open"] = "closed"
    concurrency: int = Field(default=1, ge=1, le=100_000, description="closed loop: users")
    request_rate: float | None = Field(default=None, gt=0, description="open loop: requests per second")
    arrival: Literal["poisson", "gamma", "constant"] = "poisson"
    burstiness: float = Field(default=1.0, gt=0, description="gamma shape: 1 = Poisson, <1 burstier")
    max_concurrency: int = Field(default=256, ge=1, le=100_000)
    request_timeout_s: float = Field(default=60.0, gt=0)
    lag_warn_ms: float = Field(default=25.0, gt=0)
    http_client: Literal["auto", "fast", "aiohttp"] = Field(
        default="auto",
        description="auto: vramlab's own HTTP/1.1 client for http://, aiohttp for https:// "
        "(fast: insist on the own client; aiohttp: always aiohttp)",
    )
    retry: Retry = Retry()


class Samplers(_Model):
    interval_s: float = Field(default=1.0, gt=0, le=3600)
    sources: list[SamplerSource] = ["gpu", "engine", "host", "health"]
    ledger: str | None = Field(default=None, description="the sim's device ledger file")
    prometheus_url: str | None = None
    prometheus_queries: dict[str, str] = Field(default_factory=dict)


class Plan(_Model, PlanDocument):
    kind: Literal["experiment"] = "experiment"
    name: str = Field(min_length=1, max_length=200)
    hypothesis: str = ""
    target: Target
    fixed: Fixed
    change: Change
    phases: Phases
    rounds: int = Field(default=3, ge=1, le=100)
    load: Load = Load()
    metrics: dict[str, float] = Field(default_factory=dict)
    stop_conditions: StopConditions = StopConditions()
    rollback: list[RollbackCommand] = Field(default_factory=list)
    samplers: Samplers = Samplers()
    capacity: CapacityFacts | None = None

    _rollback_strings = field_validator("rollback", mode="before")(rollback_strings)

    @field_validator("metrics")
    @classmethod
    def _metric_names(cls, v: dict[str, float]) -> dict[str, float]:
        for k, limit in v.items():
            if not _METRIC_NAME.match(k):
                raise ValueError(
                    f"unknown metric {k!r}; use e.g. p95_ttft_ms, p99_e2e_ms, error_rate, min_goodput_rps"
                )
            # a latency, a rate or a throughput: no window can be under a negative limit
            if not math.isfinite(limit) or limit < 0 or (k == "error_rate" and limit > 1):
                want = "a fraction from 0 to 1" if k == "error_rate" else "a finite number, 0 or more"
                raise ValueError(f"@{k}: must be {want}, got {limit:g}")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> Plan:
        var, load = self.change.variable, self.load
        if var == "request_rate" and load.mode != "open":
            raise ValueError("@change.variable: request_rate needs load.mode: open")
        if (
            load.mode == "open"
            and load.request_rate is None
            and var != "request_rate"
            and self.fixed.input.trace is None
        ):
            raise ValueError("@load.mode: open needs load.request_rate")
        if var == "concurrency" and any(v != int(v) for v in self.change.values()):
            raise ValueError("@change: concurrency steps must be whole numbers")
        if self.fixed.input.conversations is not None and load.mode != "closed":
            raise ValueError(
                "@load.mode: conversations are walked turn by turn by users: use load.mode: closed"
            )
        if var == "prompt_tokens" and self.fixed.input.synthetic is None:
            raise ValueError("@change.variable: prompt_tokens needs a synthetic input set")
        if self.fixed.input.trace is not None:
            if load.mode != "open":
                raise ValueError("@load.mode: a trace sets its own send times: use load.mode: open")
            if var in ("request_rate", "output_tokens") and self.change.baseline is None:
                raise ValueError(
                    f"@change.baseline: a trace with {var} as the variable needs change.baseline "
                    "(its value in baseline and recovery; the trace itself has no one value)"
                )
        if "ledger" in self.samplers.sources and not self.samplers.ledger and self.target.sim is None:
            raise ValueError("@samplers.sources: 'ledger' needs samplers.ledger (the sim's device file)")
        if "prometheus" in self.samplers.sources and not self.samplers.prometheus_url:
            raise ValueError("@samplers.sources: 'prometheus' needs samplers.prometheus_url")
        if load.http_client == "fast" and self.target.base_url is not None:
            from vramlab.load.client import fast_path_refusal

            why = fast_path_refusal(self.target.base_url)
            if why is not None:
                raise ValueError(f"@load.http_client: fast, but {why}; use auto or aiohttp")
        return self

    # -- derived, read-only views ------------------------------------------------------------
    def baseline_value(self) -> float:
        """The variable's value outside treatment: change.baseline, else the load's own setting."""
        if self.change.baseline is not None:
            return self.change.baseline
        var, load, syn = self.change.variable, self.load, self.fixed.input.synthetic
        if var == "concurrency":
            return float(load.max_concurrency if load.mode == "open" else load.concurrency)
        if var == "request_rate":
            return load.request_rate if load.request_rate is not None else self.change.values()[0]
        if var == "prompt_tokens":
            return float(syn.prompt_tokens)  # type: ignore[union-attr]
        return float(syn.output_tokens) if syn else 256.0

    def planned_seconds(self) -> float | None:
        """Planned time for all rounds, when the window is time-bound (a search: at most
        max_probes treatment windows; a soak: its duration)."""
        ch, drain = self.change, min(self.phases.drain_s, 1.0)
        if ch.soak is not None:  # baseline and recovery windows (a minute each if not time-bound), the soak
            window = (self.phases.duration_s or 60.0) + drain
            return self.rounds * (2 * window + ch.soak.duration_s + drain)
        if self.phases.duration_s is None:
            return None
        steps = ch.search.max_probes if ch.search is not None else len(ch.values())
        return self.rounds * (2 + steps) * (self.phases.duration_s + drain)

    def wall_clock_s(self) -> float:
        """The wall-clock stop: explicit, or twice the planned time + 60 s, or one hour."""
        if self.stop_conditions.wall_clock_s is not None:
            return self.stop_conditions.wall_clock_s
        planned = self.planned_seconds()
        return 2 * planned + 60 if planned is not None else 3600.0

    def warnings(self) -> list[str]:
        out = self.old_name_notes()
        if self.rounds < 3:
            out.append(f"rounds: {self.rounds} is fewer than 3; one-off spikes cannot be told from trends")
        if self.target.environment == "staging":
            out.append("target.environment is staging: make sure the people who share it know")
        return out


# ---------------------------------------------------------------------------------------------
# Loading with line numbers (vramlab.planfile, the loader run, drill and pack plans share)

_MAPPING = {"kind": "a plan", "keys": "kind: experiment, name:, target:, ..."}
_KINDS: dict[str, type[Plan]] = {"experiment": Plan}


def parse_plan(text: str, filename: str = "plan.yaml") -> Plan:
    """Validate a plan document; raise ConfigError ``file:line: field: message``."""
    from vramlab.planfile import parse_yaml, validate_plan

    return validate_plan(_KINDS, parse_yaml(text, filename), **_MAPPING)


def load_plan(path: str | Path) -> Plan:
    from vramlab.planfile import read_yaml, validate_plan

    p = Path(path)
    plan = validate_plan(_KINDS, read_yaml(p, "plan"), **_MAPPING)
    for key in ("jsonl", "trace"):
        name = getattr(plan.fixed.input, key)
        if name is not None:
            jp = Path(name)
            if not jp.is_absolute():
                jp = p.parent / jp
            if not jp.is_file():
                raise ConfigError(f"{p}: fixed.input.{key}: no such file {str(jp)!r}")
            if key == "trace":  # a malformed trace is bad input: refused before anything runs
                from vramlab.load.trace import read_trace

                inp = plan.fixed.input
                read_trace(jp, inp.format, inp.time_scale, inp.max_requests)  # type: ignore[arg-type]
    return plan
