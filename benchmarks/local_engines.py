"""What `accuracy.py` needs for llama.cpp placement and Ollama rows: their settings, their card, the
figures to score, and the per-device / per-decision table (docs/capacity-model.md).

- llama.cpp rows with several devices (`extra.devices`, `extra.free_mib_per_device`: llama.cpp's
  default split is by free memory; `extra.override_tensor`) are planned with every card, and scored
  on the sums the row holds; the per-device buffers (`extra.llamacpp_cuda_*_buffers_mib`) in the table.
- Ollama rows hold Ollama's own estimate line: scored on `memory.weights.total` and `memory.required.kv`,
  and the layers it offloads (`extra.ollama_layers_offload`), on the free memory it printed.
"""

from __future__ import annotations

from typing import Any

from vramlab.capacity import GIB, custom_gpu, get_gpu

MIB = 1 << 20


def gpu(row: dict[str, Any]):
    """Ollama decides on the free memory its line prints; None = accuracy.py's own rule."""
    extra = row.get("extra") or {}
    if row.get("engine") == "ollama" and extra.get("ollama_available_gib"):
        return custom_gpu(float(extra["ollama_available_gib"]))
    return None


def settings(row: dict[str, Any]) -> dict[str, Any]:
    """EngineSettings fields beyond accuracy.py's: the devices, split and overrides; Ollama's num_ctx."""
    extra, out = row.get("extra") or {}, {}
    if row.get("engine") == "llama.cpp" and extra.get("devices"):
        out["devices"] = tuple((name, get_gpu(name).memory_bytes) for name in extra["devices"])
        if extra.get("free_mib_per_device"):
            out["tensor_split"] = tuple(float(x) for x in extra["free_mib_per_device"])
    if row.get("engine") == "llama.cpp" and extra.get("override_tensor"):
        out["override_tensor"] = (str(extra["override_tensor"]),)
    if row.get("engine") == "ollama":
        out.update(
            max_model_len=row.get("n_ctx") or row.get("max_model_len"),
            parallel=row.get("n_parallel"),
            ctx_size=None,
            n_ubatch=None,
            flash_attn=extra.get("flash_attn"),
            kv_cache_dtype="auto",
        )
    return out


def scored(row: dict[str, Any], est: Any) -> dict[str, float] | None:
    """The figures a row is scored on when they are not device 0's components (GiB)."""
    if est.engine == "ollama":
        o = est.extra["ollama"]
        return {
            "weights": o["memory_weights_total_bytes"] / GIB,
            "kv_cache_gib": o["memory_required_kv_bytes"] / GIB,
        }
    devices = est.extra.get("devices") or []
    if est.engine == "llama.cpp" and len(devices) > 1:
        return {
            "weights": sum(d["model_buffer_bytes"] for d in devices) / GIB,
            "kv_cache_gib": sum(d["kv_buffer_bytes"] for d in devices) / GIB,
        }
    return None


def table(rows: list[dict[str, Any]], plan: Any) -> list[dict[str, Any]]:
    """Per device (llama.cpp) and per decision (Ollama): logged beside planned. *plan(row)* -> Estimate or None."""
    out: list[dict[str, Any]] = []
    for row in rows:
        extra = row.get("extra") or {}
        per_device = extra.get("llamacpp_cuda_kv_buffers_mib")
        if not per_device and "ollama_layers_offload" not in extra:
            continue
        est = plan(row)
        if est is None:
            continue
        if row.get("engine") == "ollama":
            o = est.extra["ollama"]
            out.append(
                {
                    "row": row["row_id"],
                    "what": "layers offloaded",
                    "logged": extra["ollama_layers_offload"],
                    "planned": o["layers_offload"],
                }
            )
            continue
        for key, field in (
            ("llamacpp_cuda_model_buffers_mib", "model_buffer_bytes"),
            ("llamacpp_cuda_kv_buffers_mib", "kv_buffer_bytes"),
            ("llamacpp_cuda_compute_buffers_mib", "compute_buffer_bytes"),
        ):
            for i, (seen, dev) in enumerate(
                zip(extra.get(key) or [], est.extra.get("devices") or [], strict=False)
            ):
                out.append(
                    {
                        "row": row["row_id"],
                        "what": f"CUDA{i} {field.split('_')[0]} buffer MiB",
                        "logged": seen,
                        "planned": round(dev[field] / MIB, 2),
                    }
                )
    for line in out:
        logged = float(line["logged"])
        line["error_pct"] = round((float(line["planned"]) - logged) / logged * 100, 2) if logged else None
    return out
