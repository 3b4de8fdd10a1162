"""Band coverage for benchmarks/accuracy.py: is the measured KV pool inside the plan's band, and how wide is it.

The band is the plan's own (`kv_band_bytes`, signed like `kv_available_bytes`; the pessimistic and optimistic
pools in tokens where a log prints only tokens), scored held-out like every other figure.
"""

from __future__ import annotations

import statistics
from typing import Any

GIB = 1 << 30


# Half the last printed digit of a log's figure: a value printed to 0.01 GiB sits within 0.005 GiB of the truth.
PRINTED_GIB = 0.005


def printed_slack(value: float) -> float:
    """Half the last digit the figure was printed with (Ollama prints "9.5 GiB": 0.05), at least PRINTED_GIB."""
    text = repr(value)
    decimals = len(text.split(".", 1)[1]) if "." in text and "e" not in text else 0
    return max(PRINTED_GIB, 0.5 * 10**-decimals)


def band_score(
    est: Any, obs: dict[str, float | None], planned_gib: float | None = None
) -> tuple[bool, float, str] | None:
    """(the measured KV pool lies inside the plan's band, the band's width as % of the planned value, the
    measurement) for one row: GiB where the log prints them (signed, like kv_available_bytes), else tokens."""
    if obs.get("kv_cache_gib") is not None:
        low, high = (b / GIB for b in est.extra["kv_band_bytes"])
        seen, mid, slack, what = (
            float(obs["kv_cache_gib"]),
            est.kv_available_bytes / GIB,
            printed_slack(float(obs["kv_cache_gib"])),
            "GiB",
        )
        if planned_gib is not None and mid and planned_gib != mid:
            # the figure the log prints is not the plan's first-card pool (llama.cpp over several cards, Ollama's
            # whole-model KV with some layers on the host): benchmarks/local_engines.py plans that figure, and
            # the band scales with it
            scale = planned_gib / mid
            low, high, mid = sorted((low * scale, high * scale)) + [planned_gib]
    elif obs.get("kv_cache_tokens") and est.pessimistic and est.optimistic:
        low, high = float(est.pessimistic.kv_cache_tokens), float(est.optimistic.kv_cache_tokens)
        seen, mid, slack, what = float(obs["kv_cache_tokens"]), float(est.kv_cache_tokens), 0.5, "tokens"
    else:
        return None
    inside = low - slack <= seen <= high + slack
    return inside, (high - low) / max(abs(mid), 1e-9) * 100, what


def band_coverage(bands: list[tuple[dict[str, Any], str, bool, float, str]]) -> dict[str, Any]:
    """Per engine, on the never-seen groups and on every row: the share of measurements inside the plan's
    band and the band's mean width; and, per engine, the terms the band was widened for most often."""
    return {
        engine: _coverage([b for b in bands if b[1] == engine])
        for engine in sorted({e for _, e, *_ in bands})
    }


def band_coverage_all(bands: list[tuple[dict[str, Any], str, bool, float, str]]) -> dict[str, Any]:
    """The same over every engine's rows together: how often the band's promise held, whatever the engine."""
    return _coverage(bands)


def _coverage(rows: list[tuple[dict[str, Any], str, bool, float, str]]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    for key, keep in (("unseen", lambda g: g.startswith("unseen-")), ("all", lambda g: True)):
        xs = [b for b in rows if keep(str(b[0].get("collection_group")))]
        if xs:
            entry[key] = {
                "n": len(xs),
                "inside": sum(b[2] for b in xs) / len(xs),
                "mean_width": statistics.mean(b[3] for b in xs),
                "outside_rows": sorted(str(b[0]["row_id"]) for b in xs if not b[2]),
            }
    return entry


def print_bands(bands: dict[str, Any], every_engine: dict[str, Any] | None = None) -> None:
    print()
    print(
        "Band coverage, held-out: the share of measured KV pools (GiB where printed, else tokens) inside the"
    )
    print("plan's band, and the band's mean width (high - low, % of the planned value):")
    print(
        f"  {'engine':12} {'never-seen: n':>13} {'inside':>7} {'width':>7}   {'every row: n':>12} {'inside':>7} "
        f"{'width':>7}   outside (never-seen)"
    )
    rows = list(bands.items()) + ([("all engines", every_engine)] if every_engine else [])
    for engine, entry in rows:
        cells = []
        for key in ("unseen", "all"):
            e = entry.get(key)
            cells.append(
                f"{e['n']:>13} {e['inside']:7.1%} {e['mean_width']:6.1f}%"
                if e
                else f"{'-':>13} {'':7} {'':7}"
            )
        outside = ", ".join(entry.get("unseen", {}).get("outside_rows", [])) or "-"
        print(f"  {engine:12} {cells[0]}   {cells[1][1:]}   {outside}")
