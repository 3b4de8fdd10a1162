"""The drill plan: an experiment plan plus what a drill needs to break something safely.

    kind                               drill, or colocation (a drill with a colocation: section)
    name, description, rounds          as for an experiment
    target                             what is broken and how it is controlled (target.py)
    load                               the steady client traffic the ramp rides on, and its
                                       clients' retry policy (load.retry, as in an experiment)
    ramp                               the one knob that rises, step by step, to a ceiling
    stop_conditions                    hard limits, armed from the first request to the last
                                       (the experiment's StopConditions, with a drill's defaults)
    recovery                           auto | scripted | manual, and the limit to wait
    neighbours                         other endpoints on the same GPU, probed throughout
    cotenant                           memory a neighbour holds for the whole drill
    colocation                         engines sharing the target's simulated card (colocation.py)
    rollback                           shell commands run after the drill however it ended
    alerts                             Prometheus rules with owner and action (vramlab alerts)

The document is loaded once and never mutated; the runner works on copies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vramlab.alerts.rules import AlertRuleSpec, check_actionable
from vramlab.drill.colocation import ColocationSpec
from vramlab.drill.ramp import RampSpec
from vramlab.drill.target import TargetSpec
from vramlab.errors import ConfigError
from vramlab.plandoc import (
    CapacityFacts,
    PlanDocument,
    RecoverySpec,
    Retry,
    RollbackCommand,
    StopConditions,
    rollback_strings,
)


class _Strict(BaseModel):
    # .inf or .nan in a drill plan is refused by name; strict: "5" or true where a number goes is refused,
    # not read as 5 or 1.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class LoadSpec(_Strict):
    concurrency: int = Field(2, ge=1, le=4096)
    prompt_tokens: int = Field(128, ge=1)
    max_tokens: int = Field(16, ge=1)
    request_timeout_s: float = Field(10.0, gt=0)
    think_time_s: float = Field(0.0, ge=0)  # pause between a client's requests
    retry: Retry = Field(default_factory=Retry)  # none | immediate | exponential


def _drill_stop_defaults() -> StopConditions:
    # A drill breaks things quickly; its windows are seconds, not the experiment's ten.
    return StopConditions(error_rate=0.5, window_s=3.0, min_requests=3, oom_seen=True, wall_clock_s=300.0)


class CotenantSpec(_Strict):
    """A co-tenant that holds GPU memory for the whole drill (a neighbour that took the card's
    headroom): on the sim a ledger balloon, on a real GPU a PyTorch/CuPy balloon process."""

    hold_gib: float | None = Field(None, gt=0)
    hold_free_share: float | None = Field(None, gt=0, le=1)  # of the memory free once the target is up
    leave_gib: float | None = Field(None, ge=0)  # take all free memory but this much

    @model_validator(mode="after")
    def _one(self) -> CotenantSpec:
        if sum(x is not None for x in (self.hold_gib, self.hold_free_share, self.leave_gib)) != 1:
            raise ValueError("cotenant: give exactly one of hold_gib, hold_free_share or leave_gib")
        return self

    def bytes_to_hold(self, free_bytes: int | None) -> int:
        gib = 1 << 30
        if self.hold_gib is not None:
            return int(self.hold_gib * gib)
        if free_bytes is None:
            raise ConfigError("cotenant: free GPU memory is unknown here; give hold_gib instead")
        if self.leave_gib is not None:
            return max(0, free_bytes - int(self.leave_gib * gib))
        return int(free_bytes * (self.hold_free_share or 0.0))


class NeighbourSpec(_Strict):
    name: str
    url: str  # OpenAI-compatible root or any HTTP URL
    kind: Literal["generate", "health"] = "health"
    path: str | None = None  # default: /health for health, /v1/completions for generate
    model: str | None = None
    interval_s: float = Field(0.5, gt=0)
    timeout_s: float = Field(2.0, gt=0)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        from vramlab.drill.target import http_url

        return http_url(v)


class DrillPlan(_Strict, PlanDocument):
    kind: Literal["drill", "colocation"] = "drill"
    name: str
    description: str = ""
    hypothesis: str = ""
    rounds: int = Field(1, ge=1, le=10)
    baseline_s: float = Field(5.0, gt=0)
    target: TargetSpec
    load: LoadSpec = Field(default_factory=LoadSpec)
    ramp: RampSpec
    stop_conditions: StopConditions = Field(default_factory=_drill_stop_defaults)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    neighbours: list[NeighbourSpec] = Field(default_factory=list)
    cotenant: CotenantSpec | None = None
    colocation: ColocationSpec | None = None  # engines sharing the target's card (docs/pack.md)
    rollback: list[RollbackCommand] = Field(default_factory=list)
    alerts: list[AlertRuleSpec] = Field(default_factory=list)
    prometheus_url: str | None = None  # alert pending/firing times from its HTTP API
    sample_interval_s: float = Field(0.25, gt=0)
    store: str | None = None  # store URL; default: the user's store
    capacity: CapacityFacts | None = (
        None  # model, engine, card of a real target, for the stored capacity plan
    )

    _rollback_strings = field_validator("rollback", mode="before")(rollback_strings)

    @field_validator("stop_conditions", mode="before")
    @classmethod
    def _stop_defaults(cls, v: Any) -> Any:
        # Fields the plan leaves out take the drill's defaults, not the experiment's.
        if isinstance(v, dict):
            return {**_drill_stop_defaults().model_dump(), **v}
        return v

    @model_validator(mode="after")
    def _check(self) -> DrillPlan:
        for rule in self.alerts:
            check_actionable(rule)
        names = [n.name for n in self.neighbours]
        if (self.kind == "colocation") != (self.colocation is not None):
            raise ValueError(
                f"@kind: {self.kind}, but a drill with a colocation: section is kind: colocation and one "
                "without is kind: drill"
            )
        if self.colocation is not None:
            if self.target.kind != "sim" or self.target.sim is None:
                raise ValueError(
                    "colocation needs a sim target with target.sim (the engines share its ledger)"
                )
            names += [e.name for e in self.colocation.engines]
        if len(set(names)) != len(names):
            raise ValueError("neighbour names must be unique (colocation engines are probed as neighbours)")
        self._cotenant_fits()
        return self

    def _cotenant_fits(self) -> None:
        """A co-tenant asking for more than the sim's whole card is refused before anything starts."""
        if self.cotenant is None or self.cotenant.hold_gib is None or self.target.sim is None:
            return
        from vramlab.capacity import get_gpu
        from vramlab.errors import VramlabError

        try:
            card = get_gpu(self.target.sim.gpu)
        except VramlabError:
            return  # an unknown card: the sim refuses it by name
        card_gib = card.memory_bytes / (1 << 30)
        if self.cotenant.hold_gib >= card_gib:
            raise ValueError(
                f"@cotenant.hold_gib: {self.cotenant.hold_gib:g} GiB is more than the whole "
                f"{card.name} ({card_gib:.1f} GiB); the co-tenant could never hold it"
            )

    def warnings(self) -> list[str]:
        """Notes stored with the drill: old field names the document used, too few rounds."""
        return [line for line, _ in self.field_warnings()]

    def field_warnings(self) -> list[tuple[str, str | None]]:
        """`warnings`, each with the plan field a reader tells it by (WarningData.plan_field), or None."""
        out: list[tuple[str, str | None]] = [(line, None) for line in self.old_name_notes()]
        if self.rounds < 3:
            out.append(
                (f"rounds: {self.rounds} is fewer than 3; a one-off cannot be told from a trend", "rounds")
            )
        capped = self.ramp.capped_note()
        if capped is not None:
            out.append((capped, None))
        return out


_MAPPING = {"kind": "a drill plan", "keys": "kind: drill, name:, target:, ramp:, ..."}
_KINDS: dict[str, type[DrillPlan]] = {"drill": DrillPlan, "colocation": DrillPlan}


def load_plan(path: str | Path) -> DrillPlan:
    """Read and validate a drill plan; every problem becomes one ``file:line: field: message`` line."""
    from vramlab.planfile import read_yaml, validate_plan

    return validate_plan(_KINDS, read_yaml(path, "plan"), **_MAPPING)


def parse_plan(doc: Any, origin: str = "plan") -> DrillPlan:
    """Validate a drill plan already in memory (a dict); errors name *origin* and the field."""
    from vramlab.planfile import validate_plan

    return validate_plan(_KINDS, doc, origin, **_MAPPING)


__all__ = [
    "CotenantSpec",
    "DrillPlan",
    "LoadSpec",
    "NeighbourSpec",
    "RecoverySpec",
    "load_plan",
    "parse_plan",
]
