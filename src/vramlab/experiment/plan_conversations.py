"""`fixed.input.conversations`: N conversations of T turns with a shared system prompt and growing
history, optional tool-call pauses, and tenants with their own SLO (load/conversations.py walks
them). Documents: docs/experiments.md."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vramlab.experiment.plan_change import SLO_NAME


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Tenant(_Model):
    name: str = Field(min_length=1, max_length=64)
    share: float = Field(default=1.0, gt=0, description="its share of the conversations")
    slo: dict[str, float] = Field(
        default_factory=dict, description="its limits, as plan metrics name them: p95_ttft_ms, ..."
    )

    @field_validator("slo")
    @classmethod
    def _names(cls, v: dict[str, float]) -> dict[str, float]:
        for k, limit in v.items():
            if not SLO_NAME.match(k):
                raise ValueError(f"unknown SLO {k!r}; use e.g. p95_ttft_ms, p95_itl_ms, error_rate")
            if limit < 0:
                raise ValueError(f"{k}: a limit must be >= 0")
        return v


class Conversations(_Model):
    count: int = Field(gt=0, le=100_000, description="conversations")
    turns: int = Field(gt=0, le=1_000, description="turns in each")
    system_prompt_tokens: int = Field(default=0, ge=0, le=1_000_000, description="shared by all")
    user_tokens: int = Field(gt=0, le=1_000_000, description="each turn's new question")
    output_tokens: int = Field(gt=0, le=1_000_000)
    seed: int = 0
    tool_every: int = Field(default=0, ge=0, description="a tool-call pause after every Nth turn (0: none)")
    tool_pause_s: float = Field(default=0.0, ge=0, le=3600)
    tenants: list[Tenant] = Field(default_factory=list)

    @model_validator(mode="after")
    def _coherent(self) -> Conversations:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: each name once")
        if len(self.tenants) > self.count:
            raise ValueError("tenants: more tenants than conversations")
        if self.count * self.turns > 1_000_000:
            raise ValueError("count x turns: at most 1,000,000 requests")
        return self


__all__ = ["Conversations", "Tenant"]
