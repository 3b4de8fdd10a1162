"""Terminal rendering of `vramlab check-log`: engine figures beside the prediction, per rank."""

from __future__ import annotations

import json
from typing import Any


def _fmt(field: str, value: float | None) -> str:
    if value is None:
        return "-"
    if field.endswith("_bytes"):
        return f"{value / (1 << 30):.2f} GiB"
    if field == "max_concurrency":
        return f"{value:.2f}x"
    return f"{int(value):,}"


def _diff(field: str, row: Any) -> str:
    d, rel = row.difference, row.relative
    if d is None:
        return ""
    text = f"{d / (1 << 30):+.2f} GiB" if field.endswith("_bytes") else (
        f"{d:+.2f}x" if field == "max_concurrency" else f"{int(d):+,}")
    return text + (f" ({rel:+.1%})" if rel is not None else "")


def render(report: Any) -> str:
    out = [f"{report.source}: {report.engine} log, {report.lines} lines"]
    shown: dict[str, list[int]] = {}
    items = []
    for item in report.items:  # TP ranks that printed the same figures are shown once
        key = json.dumps([item.observation.measured(), item.error], sort_keys=True)
        if key in shown and item.observation.rank is not None:
            shown[key].append(item.observation.rank)
            continue
        shown[key] = [item.observation.rank] if item.observation.rank is not None else []
        items.append((item, shown[key]))
    for item, ranks in items:
        obs = item.observation
        rank = (f" rank {ranks[0]}" if len(ranks) == 1 else
                f" ranks {', '.join(map(str, ranks))} (same figures)" if ranks else "")
        lines = [s.line for s in obs.source_lines]
        where = f" (lines {min(lines)}-{max(lines)})" if lines else ""
        out.append("")
        out.append(f"{obs.engine} {obs.engine_version or '(version not printed)'}  {obs.model or '(model not printed)'}"
                   f"{rank}{where}")
        if item.comparison is None:
            out.append(f"  no prediction: {item.error}")
            for f in ("weights_bytes", "activation_peak_bytes", "non_torch_bytes", "cuda_graph_bytes",
                      "kv_cache_bytes", "kv_cache_tokens", "max_concurrency"):
                if getattr(obs, f) is not None:
                    out.append(f"  {f.removesuffix('_bytes'):18} {_fmt(f, getattr(obs, f)):>12}")
            continue
        cmp = item.comparison
        est = cmp.estimate
        out.append(f"  predicted for {est.model} on {cmp.gpu_reason}; settings: "
                   + ", ".join(f"{k}={v}" for k, v in sorted(item.settings_used.items())))
        out.append(f"  {'component':18} {'engine':>12} {'vramlab':>12}  difference")
        for row in cmp.rows:
            if row.observed is None and row.predicted is None:
                continue
            out.append(f"  {row.field.removesuffix('_bytes'):18} {_fmt(row.field, row.observed):>12} "
                       f"{_fmt(row.field, row.predicted):>12}  {_diff(row.field, row)}")
        if cmp.explains == "unexplained":
            unseen = [r.field.removesuffix("_bytes") for r in cmp.rows
                      if r.observed is None and r.predicted is not None and r.field.endswith("_bytes")]
            out.append("  most of the KV difference is not explained by the components the log prints"
                       + (f" (not printed: {', '.join(unseen)}; nor the budget)" if unseen else " (check the budget)"))
        elif cmp.explains:
            moved = cmp.contributions[cmp.explains]
            out.append(f"  most of the KV difference comes from {cmp.explains}: it moves the predicted KV cache by "
                       f"{moved / (1 << 30):+.2f} GiB")
    for obs in report.incomplete:
        out.append("")
        out.append(f"incomplete start-up{f' (rank {obs.rank})' if obs.rank is not None else ''}: the log ends before "
                   "the engine sized its KV cache")
    if report.summary:
        out.append("")
        out.extend(report.summary)
    return "\n".join(out)
