"""Terminal rendering of `vramlab plan --vs-engine-version`: what moved between two releases, and the rule behind it."""

from __future__ import annotations

from vramlab.capacity.regression import Change, Comparison
from vramlab.units import gib

BYTES = ("budget_bytes", "kv_cache", "used_bytes", "headroom_bytes")


def _value(change: Change, v: object) -> str:
    if isinstance(v, bool) or v is None:
        return {True: "yes", False: "no", None: "-"}[v]
    if isinstance(v, int) and (change.kind == "component" or change.item in BYTES):
        return gib(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)[:40]


def render_comparison(result: Comparison, model: str, gpu: str) -> str:
    a, b = result.version_a, result.version_b
    lines = [f"{model} on {gpu}: {result.engine} {a} -> {b} (GiB = 2^30 bytes)", ""]
    for version, why in result.errors.items():
        lines.append(f"{result.engine} {version} refuses to start: {why}")
    rows = [
        [
            c.item,
            _value(c, c.a),
            _value(c, c.b),
            ", ".join(c.rules) + (f" (through {', '.join(c.through)})" if c.through else "") or "unexplained",
        ]
        for c in result.changes
    ]
    if rows:
        header = ["component / setting / figure", a, b, "release rule"]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
        for r in [header, ["-" * w for w in widths], *rows]:
            lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    elif not result.errors:
        lines.append(f"the plans are the same at {a} and {b}")
    lines.append("")
    if result.rules:
        lines.append(f"release rules that change between {a} and {b}:")
        for rule in result.rules:
            d = rule.described
            first = ", ".join(".".join(map(str, v)) for v in rule.boundaries)
            lines.append(
                f"  {rule.name} (capacity/{rule.module.replace('.', '/')}.py; {first}): "
                f"{d.what if d else ''} [{d.source if d else ''}]"
            )
    else:
        lines.append(
            f"no release rule vramlab models for {result.engine} changes between {a} and {b}: a difference seen "
            "between these releases is not explained by this plan"
        )
    if result.unexplained:
        lines.append(f"changed without a release rule naming it: {', '.join(result.unexplained)}")
    return "\n".join(lines)
