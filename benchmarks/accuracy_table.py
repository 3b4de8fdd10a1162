"""The tables of benchmarks/accuracy.py: the README's accuracy block (held-out KV error pools, each engine's band
coverage), and per engine and per batch the never-seen rows at their first look beside the model as it stands.

The first look of each never-seen row is what its batch's results file recorded before any change that batch caused
(benchmarks/results/unseen-*-first-look-*.txt); benchmarks/results/first-look.jsonl carries that per-row figure in a
form this module reads. A row's KV capacity error is the KV pool in GiB where its log printed one, else in tokens,
as the per-row tables and the data README count it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENGINES = (
    ("vllm", "vLLM"),
    ("sglang", "SGLang"),
    ("tgi", "TGI"),
    ("llama.cpp", "llama.cpp"),
    ("ollama", "Ollama"),
)
BEGIN = (
    "<!-- accuracy-table: the figures `python benchmarks/accuracy.py` prints; "
    "tests/test_accuracy_benchmark.py keeps them equal -->"
)
END = "<!-- /accuracy-table -->"
POOLS = (
    ("every row", "pooled"),
    ("outside the vLLM 0.19 H100 sweep", "pooled_outside_the_019_sweep"),
    ("never seen (collected after the model was written)", "pooled_unseen"),
)


def first_look(path: Path) -> dict[str, list[float]]:
    """Engine -> the |KV capacity error| % of each never-seen row at its first look (rows skipped then left out)."""
    out: dict[str, list[float]] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec.get("kv_capacity_error_pct") is not None:
                out.setdefault(rec["engine"], []).append(abs(float(rec["kv_capacity_error_pct"])))
    return out


def first_look_batches(path: Path, per_row: list[dict[str, Any]], pct: Any) -> list[dict[str, Any]]:
    """Each never-seen batch as its results file scored it before any change it caused, beside the same rows now:
    the batch's file, its rows, |KV capacity error| median / p90 % at the first look and now (accuracy.py's
    per-row lines at the shipped defaults; a row scored then that the planner no longer resolves is named)."""
    now = {str(line["row"]): capacity_error(_metrics(line)) for line in per_row}
    batches: dict[str, list[dict[str, Any]]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                batches.setdefault(str(rec["first_look"]), []).append(rec)
    out = []
    for name, recs in batches.items():
        first = [
            abs(float(r["kv_capacity_error_pct"])) for r in recs if r.get("kv_capacity_error_pct") is not None
        ]
        current = [abs(e) for r in recs if (e := now.get(str(r["row"]))) is not None]
        out.append(
            {
                "first_look": name,
                "rows": [str(r["row"]) for r in recs],
                "skipped_then": [str(r["row"]) for r in recs if r.get("kv_capacity_error_pct") is None],
                "first": (len(first), pct(first, 0.5), pct(first, 0.9)) if first else None,
                "now": (len(current), pct(current, 0.5), pct(current, 0.9)) if current else None,
                # scored at the first look, not planned now (a row skipped then, e.g. a refused context, is not)
                "missing_now": sorted(
                    str(r["row"])
                    for r in recs
                    if r.get("kv_capacity_error_pct") is not None and now.get(str(r["row"])) is None
                ),
            }
        )
    return out


def print_batches(batches: list[dict[str, Any]]) -> None:
    print(
        "\nEach never-seen batch at its first look (before any change it caused) and now, |KV capacity error| %:"
    )
    print(f"  {'first look':58} {'rows':>4}  {'first look: median / p90':>25}  {'now: median / p90':>18}")
    for b in batches:
        cells = [
            f"{b[key][1]:6.1f} / {b[key][2]:6.1f} (n={b[key][0]})" if b[key] else "-"
            for key in ("first", "now")
        ]
        missing = f"  not planned now: {', '.join(b['missing_now'])}" if b["missing_now"] else ""
        missing += f"  skipped at the first look: {', '.join(b['skipped_then'])}" if b["skipped_then"] else ""
        print(f"  {b['first_look']:58} {len(b['rows']):>4}  {cells[0]:>25}  {cells[1]:>18}{missing}")


def _metrics(line: dict[str, Any]) -> dict[str, Any]:
    """The signed errors (%) of one per-row line (metric -> (planned, observed, error))."""
    return {m: v[2] for m, v in line.items() if isinstance(v, tuple | list) and len(v) == 3}


def capacity_error(metrics: dict[str, Any]) -> float | None:
    """One row's KV capacity error (%): the GiB figure where the row has one, else the tokens."""
    for metric in ("kv_cache_gib", "kv_cache_tokens"):
        if metric in metrics:
            return float(metrics[metric])
    return None


def never_seen_now(per_row: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Engine -> |KV capacity error| % of each never-seen row at the shipped defaults (accuracy.py's per-row lines)."""
    out: dict[str, list[float]] = {}
    for line in per_row:
        if str(line.get("group")).startswith("unseen-"):
            err = capacity_error(_metrics(line))
            if err is not None:
                out.setdefault(str(line["engine"]), []).append(abs(err))
    return out


def _cell(xs: list[float], pct: Any) -> str:
    return f"{len(xs)}: {pct(xs, 0.5):.1f} / {pct(xs, 0.9):.1f} %" if xs else "-"


def _coverage(entry: dict[str, Any], key: str) -> str:
    e = entry.get(key)
    return f"{e['inside'] * 100:.1f} % of {e['n']}" if e else "-"


def readme_block(held_out: dict[str, Any]) -> str:
    """The README's accuracy block, markers included: the held-out KV error pools and each engine's band coverage
    (share inside, mean width), from leave_one_group_out's result."""
    lines = [BEGIN, "| KV cache, held-out | rows | median | p90 |", "| --- | ---: | ---: | ---: |"]
    for label, pool in POOLS:
        kv = held_out[pool]["kv_cache_gib"]
        lines.append(f"| {label} | {kv['n']} | {kv['median']:.1f} % | {kv['p90']:.1f} % |")
    lines += [
        "",
        "| band coverage, held-out | never seen: inside (band width) | every row: inside (band width) |",
        "| --- | --- | --- |",
    ]
    for key, name in ENGINES:
        entry = held_out["bands"].get(key)
        if entry:
            lines.append(f"| {name} | {_band(entry.get('unseen'))} | {_band(entry.get('all'))} |")
    every = held_out["bands_every_engine"]
    lines.append(f"| all engines | {_band(every.get('unseen'))} | {_band(every.get('all'))} |")
    lines.append(END)
    return "\n".join(lines)


def _band(entry: dict[str, Any] | None) -> str:
    return (
        "–" if not entry else f"{entry['inside'] * 100:.1f} % of {entry['n']} ({entry['mean_width']:.1f} %)"
    )


def table(
    first: dict[str, list[float]],
    now: dict[str, list[float]],
    held_out_by_engine: dict[str, list[float]],
    bands: dict[str, Any],
    pct: Any,
) -> str:
    """Per engine, the never-seen rows at their first look beside the model now (never-seen rows, every row
    held-out) and the band's coverage. *pct* is accuracy.py's percentile (one definition of p90)."""
    lines = [
        "| engine | never-seen, first look (n: median / p90) | never-seen, now | every row, now, held-out "
        "| band coverage, held-out: never-seen / every row |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, name in ENGINES:
        if not (first.get(key) or now.get(key) or held_out_by_engine.get(key)):
            continue
        entry = bands.get(key, {})
        lines.append(
            f"| {name} | {_cell(first.get(key, []), pct)} | {_cell(now.get(key, []), pct)} | "
            f"{_cell(held_out_by_engine.get(key, []), pct)} | {_coverage(entry, 'unseen')} / {_coverage(entry, 'all')} |"
        )
    return "\n".join(lines)


def held_out_capacity(errs: dict[str, list[tuple[dict[str, Any], float]]]) -> dict[str, list[float]]:
    """Engine -> |KV capacity error| % of every row, held-out (leave_one_group_out's per-metric errors)."""
    by_row: dict[str, dict[str, Any]] = {}
    for metric, items in errs.items():
        for row, e in items:
            by_row.setdefault(str(row["row_id"]), {"engine": row.get("engine")})[metric] = e
    out: dict[str, list[float]] = {}
    for metrics in by_row.values():
        err = capacity_error(metrics)
        if err is not None:
            out.setdefault(str(metrics["engine"]), []).append(abs(err))
    return out
