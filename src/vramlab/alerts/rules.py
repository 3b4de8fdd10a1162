"""Prometheus alerting rules from a plan's `alerts:` list.

A rule names a *signal* (a field-level idea such as KV-cache usage) and the generator writes the
metric expression for the engine the plan targets, or the rule carries its own PromQL `expr`.
Every rule must say who acts on it (`owner`) and what they do (`action`): a threshold that
triggers no action is analysis, not alerting, and is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vramlab.errors import ConfigError

Severity = Literal["page", "critical", "warning", "info"]
Comparison = Literal[">", ">=", "<", "<=", "==", "!="]

# Prometheus duration syntax ("30s", "1m", "1h30m"); `for:` must be one of these.
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_ALERT_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_s(text: str) -> float:
    """'1m30s' -> 90.0 (Prometheus duration syntax)."""
    if not _DURATION.match(text):
        raise ConfigError(f"not a Prometheus duration: {text!r} (use e.g. 30s, 1m, 1h30m)")
    return sum(int(n) * _DURATION_UNITS_S[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text))


class AlertRuleSpec(BaseModel):
    """One rule as written in a plan."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    signal: str | None = None
    expr: str | None = None
    op: Comparison = ">"
    threshold: float | None = None
    for_: str = Field("1m", alias="for")
    severity: Severity = "warning"
    owner: str | None = None
    action: str | None = None
    runbook: str | None = None
    summary: str | None = None
    match: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _ALERT_NAME.match(v):
            raise ValueError(f"alert name {v!r} must match [a-zA-Z_][a-zA-Z0-9_]*")
        return v

    @field_validator("for_")
    @classmethod
    def _for(cls, v: str) -> str:
        if not _DURATION.match(v):
            raise ValueError(f"for: {v!r} is not a Prometheus duration (e.g. 30s, 1m)")
        return v

    @property
    def for_s(self) -> float:
        return duration_s(self.for_)


@dataclass(frozen=True)
class SignalDef:
    """How one signal reads on one engine. `{m}` is a label matcher block or '', `{mc}` the same
    matchers with a leading comma (for selectors that already have braces)."""

    expr: str
    unit: str
    meaning: str


# Metric names per engine from their docs (docs/research/drill-anchors.md §3). vLLM counters appear with
# and without `_total` and KV usage was renamed in V1, so those use __name__ regexes as
# inference-perf does.
_VLLM = {
    "kv_cache_usage": SignalDef(
        'max by (instance, model_name) ({__name__=~"vllm:(kv_cache_usage_perc|gpu_cache_usage_perc)"{mc}})',
        "ratio 0-1",
        "KV-cache blocks in use",
    ),
    "preemption_rate": SignalDef(
        'sum by (instance) (rate({__name__=~"vllm:num_preemptions(_total)?"{mc}}[1m]))',
        "per second",
        "requests preempted (recomputed) because the KV cache was full",
    ),
    "queue_waiting": SignalDef(
        "sum by (instance) (vllm:num_requests_waiting{m})", "requests", "requests waiting to be scheduled"
    ),
    "ttft_p95_s": SignalDef(
        "histogram_quantile(0.95, sum by (le, instance) (rate(vllm:time_to_first_token_seconds_bucket{m}[1m])))",
        "seconds",
        "P95 time to first token",
    ),
}
_SGLANG = {
    "kv_cache_usage": SignalDef(
        "max by (instance) (sglang:token_usage{m})", "ratio 0-1", "KV-cache tokens in use"
    ),
    "queue_waiting": SignalDef("sum by (instance) (sglang:num_queue_reqs{m})", "requests", "queued requests"),
    "preemption_rate": SignalDef(
        'sum by (instance) (rate({__name__=~"sglang:num_retracted_reqs(_total)?"{mc}}[1m]))',
        "per second",
        "requests retracted because the KV cache was full",
    ),
    "ttft_p95_s": SignalDef(
        "histogram_quantile(0.95, sum by (le, instance) (rate(sglang:time_to_first_token_seconds_bucket{m}[1m])))",
        "seconds",
        "P95 time to first token",
    ),
}
_TGI = {
    "queue_waiting": SignalDef("sum by (instance) (tgi_queue_size{m})", "requests", "queued requests"),
    "error_rate": SignalDef(
        "sum by (instance) (rate(tgi_request_failure{m}[1m])) / sum by (instance) (rate(tgi_request_count{m}[1m]))",
        "ratio 0-1",
        "share of requests that failed (overloaded, generation, validation)",
    ),
    "overload_rate": SignalDef(
        'sum by (instance) (rate(tgi_request_failure{err="overloaded"{mc}}[1m]))',
        "per second",
        'requests refused with 429 "Model is overloaded"',
    ),
}
_LLAMACPP = {
    "kv_cache_usage": SignalDef(
        'max by (instance) ({__name__="llamacpp:kv_cache_usage_ratio"{mc}})', "ratio 0-1", "KV-cache usage"
    ),
    "queue_waiting": SignalDef(
        'sum by (instance) ({__name__="llamacpp:requests_deferred"{mc}})',
        "requests",
        "requests deferred to a slot",
    ),
}
# DCGM exporter fields are engine-independent (MiB gauges; XID holds the last code, so alert on change).
_DCGM = {
    "gpu_memory_share": SignalDef(
        "max by (gpu, Hostname) (DCGM_FI_DEV_FB_USED{m} / (DCGM_FI_DEV_FB_USED{m} + DCGM_FI_DEV_FB_FREE{m}))",
        "ratio 0-1",
        "share of GPU framebuffer memory in use",
    ),
    "xid_errors": SignalDef(
        "max by (gpu, Hostname) (changes(DCGM_FI_DEV_XID_ERRORS{m}[5m]))",
        "changes in 5m",
        "a new Xid error code was reported",
    ),
}
_ANY = {
    "target_down": SignalDef("max by (instance, job) (1 - up{m})", "0/1", "the scrape target is down"),
    # vLLM exports HTTP counters itself (prometheus_fastapi_instrumentator); for the other engines
    # the same names come from the proxy or ingress in front of them.
    "error_rate": SignalDef(
        'sum by (instance) (rate(http_requests_total{status=~"5..|429"{mc}}[1m]))'
        " / sum by (instance) (rate(http_requests_total{m}[1m]))",
        "ratio 0-1",
        "share of HTTP requests answered 5xx or 429",
    ),
}

ENGINE_SIGNALS: dict[str, dict[str, SignalDef]] = {
    "vllm": _VLLM,
    "sglang": _SGLANG,
    "tgi": _TGI,
    "llama.cpp": _LLAMACPP,
}


def signals_for(engine: str) -> dict[str, SignalDef]:
    from vramlab.engines import canonical

    name = canonical(engine) or engine  # the registry's name for it (llamacpp is llama.cpp)
    if name not in ENGINE_SIGNALS:
        from vramlab.errors import unknown

        raise unknown("engine", engine, list(ENGINE_SIGNALS))
    return {**_DCGM, **_ANY, **ENGINE_SIGNALS[name]}  # an engine's own metric wins (TGI's error rate)


def _matchers(match: dict[str, str]) -> tuple[str, str]:
    if not match:
        return "", ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(match.items()))
    return "{" + inner + "}", "," + inner


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def check_actionable(rule: AlertRuleSpec) -> None:
    """Refuse a rule nobody acts on (MISSION: every alert threshold maps to an owner and an action)."""
    missing = [f for f in ("owner", "action") if not (getattr(rule, f) or "").strip()]
    if missing:
        raise ConfigError(
            f"alert {rule.name}: no {' and no '.join(missing)}; a threshold nobody acts on is analysis, "
            "not alerting (add owner: and action:, or move it out of alerts:)"
        )


def rule_expr(rule: AlertRuleSpec, engine: str) -> str:
    """The PromQL of one rule, comparison included."""
    if rule.expr and rule.signal:
        raise ConfigError(f"alert {rule.name}: give signal: or expr:, not both")
    if rule.expr:
        base = rule.expr.strip()
        if rule.threshold is None:
            return base  # a raw expr may already hold its comparison
    else:
        if not rule.signal:
            raise ConfigError(f"alert {rule.name}: needs signal: (one of a known set) or expr:")
        table = signals_for(engine)
        if rule.signal not in table:
            from vramlab.errors import unknown

            err = unknown(f"signal for engine {engine} in alert {rule.name}:", rule.signal, list(table))
            raise ConfigError(str(err))
        m, mc = _matchers(rule.match)
        base = table[rule.signal].expr.replace("{mc}", mc).replace("{m}", m)
        if rule.threshold is None:
            raise ConfigError(f"alert {rule.name}: needs threshold:")
    return f"{base} {rule.op} {_number(rule.threshold)}"


def _number(x: float | None) -> str:
    assert x is not None
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def build_rule(rule: AlertRuleSpec, engine: str) -> dict[str, Any]:
    check_actionable(rule)
    expr = rule_expr(rule, engine)
    meaning = ""
    if rule.signal and rule.signal in signals_for(engine):
        meaning = signals_for(engine)[rule.signal].meaning
    summary = rule.summary or (
        f"{meaning or rule.name} {rule.op} {_number(rule.threshold)} for {rule.for_}"
        if rule.threshold is not None
        else rule.name
    )
    annotations = {"summary": summary, "action": (rule.action or "").strip()}
    if rule.runbook:
        annotations["runbook_url"] = rule.runbook
    return {
        "alert": rule.name,
        "expr": expr,
        "for": rule.for_,
        "labels": {"severity": rule.severity, "owner": (rule.owner or "").strip()},
        "annotations": annotations,
    }


def build_rule_groups(
    rules: list[AlertRuleSpec], engine: str, group: str, interval: str | None = None
) -> dict[str, Any]:
    """The rules file document: {"groups": [{"name", "rules": [...]}]}."""
    if not rules:
        raise ConfigError("the plan has no alerts: section; nothing to write")
    names = [r.name for r in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"alert names must be unique; repeated: {', '.join(dupes)}")
    grp: dict[str, Any] = {"name": group, "rules": [build_rule(r, engine) for r in rules]}
    if interval:
        grp["interval"] = interval
    return {"groups": [grp]}


def to_yaml(doc: dict[str, Any]) -> str:
    import yaml

    header = "# Generated by `vramlab alerts`; check with `promtool check rules FILE`.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000)


__all__ = [
    "ENGINE_SIGNALS",
    "AlertRuleSpec",
    "SignalDef",
    "build_rule",
    "build_rule_groups",
    "check_actionable",
    "duration_s",
    "rule_expr",
    "signals_for",
    "to_yaml",
]
