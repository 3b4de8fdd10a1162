"""The drill plan: an experiment plan plus what a drill needs to break something safely.

    name, description, rounds          as for an experiment
    target                             what is broken and how it is controlled (target.py)
    load                               the steady client traffic the ramp rides on
    ramp                               the one knob that rises, step by step, to a ceiling
    stop                               hard limits, armed from the first request to the last
    recovery                           auto | scripted | manual, and the limit to wait
    neighbours                         other endpoints on the same GPU, probed throughout
    clients                            the retry policy the load's clients follow
    alerts                             Prometheus rules with owner and action (vramlab alerts)

The document is loaded once and never mutated; the runner works on copies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vramlab.alerts.rules import AlertRuleSpec, check_actionable
from vramlab.drill.ramp import RampSpec
from vramlab.drill.target import TargetSpec
from vramlab.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoadSpec(_Strict):
    concurrency: int = Field(2, ge=1, le=4096)
    prompt_tokens: int = Field(128, ge=1)
    max_tokens: int = Field(16, ge=1)
    request_timeout_s: float = Field(10.0, gt=0)
    think_time_s: float = Field(0.0, ge=0)  # pause between a client's requests


class StopSpec(_Strict):
    """Hard limits. They always hold: a plan cannot switch them all off."""

    on_oom: bool = True  # OOM detected (response body, log signature, process exit after OOM)
    error_rate: float = Field(0.5, gt=0, le=1)  # above this share of failed requests ...
    error_window_s: float = Field(5.0, gt=0)  # ... over this many seconds
    max_wall_s: float = Field(300.0, gt=0)  # the whole drill, recovery included
    max_gpu_memory_share: float = Field(0.995, gt=0, le=1)  # of the card, from GPU samples


class RecoverySpec(_Strict):
    mode: Literal["auto", "scripted", "manual"] = "auto"
    command: str | None = None  # scripted: run after `delay_s`
    delay_s: float = Field(0.0, ge=0)  # operator delay before the scripted command
    restart_delay_s: float = Field(0.5, ge=0)  # auto: how long the supervisor waits before restarting
    liveness_grace_s: float = Field(5.0, ge=0)  # auto: health failing this long on a live process -> restart
    limit_s: float = Field(60.0, gt=0)  # not serving again within this: "not recovered"
    observe_s: float = Field(5.0, ge=0)  # after recovery: watch for a second OOM and the retry storm
    p95_tolerance: float = Field(0.5, ge=0)  # P95 back within (1 + tolerance) x baseline counts as recovered
    undo_ramp: bool = True  # recover at the last safe step, not the failing one

    @model_validator(mode="after")
    def _check(self) -> RecoverySpec:
        if self.mode == "scripted" and not self.command:
            raise ValueError("recovery.mode scripted needs recovery.command")
        return self


class NeighbourSpec(_Strict):
    name: str
    url: str  # OpenAI-compatible root or any HTTP URL
    kind: Literal["generate", "health"] = "health"
    path: str | None = None  # default: /health for health, /v1/completions for generate
    model: str | None = None
    interval_s: float = Field(0.5, gt=0)
    timeout_s: float = Field(2.0, gt=0)


class ClientSpec(_Strict):
    retry: Literal["none", "immediate", "backoff"] = "none"
    max_retries: int = Field(3, ge=0, le=20)
    base_delay_s: float = Field(0.2, ge=0)
    max_delay_s: float = Field(5.0, ge=0)
    jitter: bool = True


class DrillPlan(_Strict):
    name: str
    description: str = ""
    rounds: int = Field(1, ge=1, le=10)
    baseline_s: float = Field(5.0, gt=0)
    target: TargetSpec
    load: LoadSpec = Field(default_factory=LoadSpec)
    ramp: RampSpec
    stop: StopSpec = Field(default_factory=StopSpec)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    neighbours: list[NeighbourSpec] = Field(default_factory=list)
    clients: ClientSpec = Field(default_factory=ClientSpec)
    alerts: list[AlertRuleSpec] = Field(default_factory=list)
    prometheus_url: str | None = None  # alert pending/firing times from its HTTP API
    sample_interval_s: float = Field(0.25, gt=0)
    store: str | None = None  # store URL; default: the user's store

    @model_validator(mode="after")
    def _check(self) -> DrillPlan:
        for rule in self.alerts:
            check_actionable(rule)
        names = [n.name for n in self.neighbours]
        if len(set(names)) != len(names):
            raise ValueError("neighbour names must be unique")
        return self


def load_plan(path: str | Path) -> DrillPlan:
    """Read and validate a drill plan; every problem becomes one readable line."""
    import yaml

    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no such plan file: {p}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{p}:{where} is not valid YAML") from None
    return parse_plan(doc, str(p))


def parse_plan(doc: Any, origin: str = "plan") -> DrillPlan:
    if not isinstance(doc, dict):
        raise ConfigError(f"{origin}: a drill plan is a mapping (name:, target:, ramp:, ...)")
    try:
        return DrillPlan.model_validate(doc)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "plan"
        msg = str(err["msg"]).removeprefix("Value error, ")
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ConfigError(f"{origin}: {loc}: {msg}{more}") from None


__all__ = [
    "ClientSpec",
    "DrillPlan",
    "LoadSpec",
    "NeighbourSpec",
    "RecoverySpec",
    "StopSpec",
    "load_plan",
    "parse_plan",
]
