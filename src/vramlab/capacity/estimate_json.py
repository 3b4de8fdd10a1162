"""An `Estimate` back from the JSON of `vramlab plan --json` (docs/plan-json.md): what a run stores
as its capacity plan, so a sim can serve it (`vramlab sim serve --plan`) and two runs' plans can be
compared release rule by release rule (capacity/regression.py)."""

from __future__ import annotations

from typing import Any

from vramlab.capacity.estimate import Estimate
from vramlab.errors import ConfigError


def estimate_from_json(data: dict[str, Any]) -> Estimate:
    """Rebuild an `Estimate` from `vramlab plan --json` output."""
    from vramlab.capacity.estimate import Component, Limits

    try:
        comps = tuple(Component(**c) for c in data["components"])
        lims = {
            k: Limits(
                **{
                    f: data[k][f]
                    for f in ("kv_cache_bytes", "kv_cache_tokens", "num_blocks", "max_concurrency")
                }
            )
            for k in ("pessimistic", "optimistic")
            if k in data
        }
        return Estimate(
            model=data["model"],
            gpu=data["gpu"],
            engine=data["engine"],
            engine_version=data["engine_version"],
            gpu_memory_bytes=int(data["gpu_memory_bytes"]),
            settings=dict(data.get("settings", {})),
            components=comps,
            kv_bytes_per_token=int(data["kv_bytes_per_token"]),
            block_size=int(data["block_size"]),
            num_blocks=int(data["num_blocks"]),
            kv_cache_bytes=int(data["kv_cache_bytes"]),
            kv_cache_tokens=int(data["kv_cache_tokens"]),
            max_concurrency=float(data["max_concurrency"]),
            max_model_len=int(data["max_model_len"]),
            budget_bytes=int(data["budget_bytes"]),
            used_bytes=int(data["used_bytes"]),
            headroom_bytes=int(data["headroom_bytes"]),
            fits=bool(data["fits"]),
            reasons=tuple(data.get("reasons", ())),
            suggestions=tuple(data.get("suggestions", ())),
            notes=tuple(data.get("notes", ())),
            pessimistic=lims.get("pessimistic"),
            optimistic=lims.get("optimistic"),
            per_sequence_state_bytes=int(data.get("per_sequence_state_bytes", 0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"not a `vramlab plan --json` object: {type(exc).__name__}: {exc}") from None


__all__ = ["estimate_from_json"]
