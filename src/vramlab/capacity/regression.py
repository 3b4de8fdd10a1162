"""Version regression: the same plan at two releases, component by component, with the release rule behind each
difference (capacity/rules.py).

A component, setting or figure that differs is attributed to the crossed rules that say they move it; the KV pool's
bytes, tokens and concurrency (and the used / headroom figures) also inherit the rules of whatever else moved, marked
"through" it. A difference no crossed rule names is listed as unexplained: the plan changed for a reason no release
rule owns (a bug, or a rule that needs describing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vramlab.capacity.constants import Constants
from vramlab.capacity.estimate import Estimate
from vramlab.capacity.gpus import GPU
from vramlab.capacity.model import estimate
from vramlab.capacity.rules import ReleaseRule, crossed
from vramlab.capacity.settings import EngineSettings
from vramlab.capacity.spec import ModelSpec
from vramlab.errors import ConfigError

FIGURES = (
    ("budget_bytes", "budget_bytes"),
    ("kv_cache", "kv_cache_bytes"),
    ("kv_cache_tokens", "kv_cache_tokens"),
    ("max_concurrency", "max_concurrency"),
    ("kv_bytes_per_token", "kv_bytes_per_token"),
    ("max_model_len", "max_model_len"),
    ("used_bytes", "used_bytes"),
    ("headroom_bytes", "headroom_bytes"),
    ("fits", "fits"),
)
# Figures that follow from everything else: they inherit the rules of whatever else moved.
DERIVED = ("kv_cache", "kv_cache_tokens", "max_concurrency", "used_bytes", "headroom_bytes", "fits")
EXTRAS = ("speculative", "kv_offload")


@dataclass(frozen=True)
class Change:
    item: str  # a component, a resolved setting or a figure
    kind: str  # "component" | "setting" | "figure"
    a: Any
    b: Any
    rules: tuple[str, ...]  # crossed rules that move it
    through: tuple[str, ...] = ()  # other changed items whose rules it inherits

    def to_json(self) -> dict[str, Any]:
        delta = self.b - self.a if _numeric(self.a) and _numeric(self.b) else None
        return {
            "item": self.item,
            "kind": self.kind,
            "a": self.a,
            "b": self.b,
            "delta": round(delta, 4) if isinstance(delta, float) else delta,
            "rules": list(self.rules),
            "through": list(self.through),
        }


@dataclass(frozen=True)
class Comparison:
    engine: str
    version_a: str
    version_b: str
    a: Estimate | None
    b: Estimate | None
    rules: tuple[ReleaseRule, ...]
    changes: tuple[Change, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)  # release -> why the engine refuses it

    @property
    def unexplained(self) -> list[str]:
        return [c.item for c in self.changes if not c.rules and not c.through]

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "version_a": self.version_a,
            "version_b": self.version_b,
            "rules_crossed": [r.to_json() for r in self.rules],
            "changes": [c.to_json() for c in self.changes],
            "unexplained": self.unexplained,
            "errors": self.errors,
            "a": self.a.to_json() if self.a else None,
            "b": self.b.to_json() if self.b else None,
        }


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _plan(model: ModelSpec, gpu: GPU, s: EngineSettings, constants: Constants | None) -> Estimate | str:
    try:
        return estimate(model, gpu, s, constants, with_suggestions=False)
    except ConfigError as exc:
        return str(exc)


def compare(
    model: ModelSpec, gpu: GPU, settings: EngineSettings, other: str, constants: Constants | None = None
) -> Comparison:
    """The plan at settings' release (A) and at *other* (B), and what moved between them."""
    version_a = settings.resolved_version
    a = _plan(model, gpu, settings, constants)
    b = _plan(model, gpu, settings.with_(engine_version=other), constants)
    rules = tuple(crossed(settings.engine, version_a, other))
    errors = {v: e for v, e in ((version_a, a), (other, b)) if isinstance(e, str)}
    if isinstance(a, str) or isinstance(b, str):
        change = Change(
            "start-up",
            "figure",
            "refused" if isinstance(a, str) else "starts",
            "refused" if isinstance(b, str) else "starts",
            tuple(r.name for r in rules),
        )
        changes = (change,) if isinstance(a, str) != isinstance(b, str) else ()
        return Comparison(
            settings.engine,
            version_a,
            other,
            None if isinstance(a, str) else a,
            None if isinstance(b, str) else b,
            rules,
            changes,
            errors,
        )
    return Comparison(settings.engine, version_a, other, a, b, rules, tuple(changes_between(a, b, rules)))


def _items(e: Estimate) -> dict[tuple[str, str], Any]:
    parts = [c for c in e.components if c.name != "kv_cache"]  # the pool is a figure below
    out: dict[tuple[str, str], Any] = {("component", c.name): c.bytes for c in parts}
    out.update({("component", c.name + ".in_budget"): c.in_budget for c in parts})
    out.update({("setting", k): v for k, v in e.settings.items()})
    figures = {name: getattr(e, attr) for name, attr in FIGURES}
    figures["max_concurrency"] = round(e.max_concurrency, 2)
    out.update({("figure", k): v for k, v in figures.items()})
    out.update({("figure", k): e.extra[k] for k in EXTRAS if k in e.extra})
    return out


def changes_between(a: Estimate, b: Estimate, rules: tuple[ReleaseRule, ...]) -> list[Change]:
    ia, ib = _items(a), _items(b)
    keys = list(dict.fromkeys(list(ia) + list(ib)))
    moved = [k for k in keys if ia.get(k) != ib.get(k)]

    def direct(item: str) -> tuple[str, ...]:
        base = item.split(".")[0]
        return tuple(r.name for r in rules if r.described and base in r.described.moves)

    causes = [(k[1], direct(k[1])) for k in moved if k[1] not in DERIVED]
    out = []
    for kind, item in moved:
        own = direct(item)
        through: tuple[str, ...] = ()
        if item in DERIVED:
            through = tuple(other for other, names in causes if names and other != item)
            own = tuple(
                dict.fromkeys(own + tuple(n for other, names in causes for n in names if other in through))
            )
        out.append(Change(item, kind, ia.get((kind, item)), ib.get((kind, item)), own, through))
    return out
