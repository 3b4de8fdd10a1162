"""An observation beside the prediction for the same settings, and where the difference comes from.

The engines size the KV pool as *budget minus the other in-budget components*, so every GiB
a component is mispredicted by moves the KV prediction by the same GiB the other way. The
component with the largest such contribution "explains" the KV difference.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields
from typing import Any

from vramlab.capacity.estimate import Estimate
from vramlab.capacity.settings import EngineSettings
from vramlab.errors import ConfigError
from vramlab.logs.cards import gpu_for, llamacpp_placement
from vramlab.logs.observation import Observation

# Estimate component name -> Observation field.
COMPONENT_FIELD = {
    "weights": "weights_bytes",
    "activation_peak": "activation_peak_bytes",
    "non_torch": "non_torch_bytes",
    "cuda_graphs": "cuda_graph_bytes",
    "kv_cache": "kv_cache_bytes",
}
ROWS = (
    "weights_bytes",
    "activation_peak_bytes",
    "non_torch_bytes",
    "cuda_graph_bytes",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "max_concurrency",
)
# The engine the capacity model has a policy for, per log engine (Ollama runs llama.cpp).
MODEL_ENGINE = {"ollama": "llama.cpp"}
OLLAMA_ESTIMATOR_RELEASE = "0.11.6"  # capacity/engines/ollama.py reads llm/memory.go at this tag
_SETTING_FIELDS = {f.name for f in fields(EngineSettings)}


def model_engine(obs: Observation) -> str:
    """The policy that predicts an observation: Ollama's own estimate line (`msg=offload ... memory.*`)
    against the Ollama policy; the llama.cpp lines an Ollama log also carries against llama.cpp's."""
    if obs.engine == "ollama" and obs.basis == "engine-estimate":
        return "ollama"
    return MODEL_ENGINE.get(obs.engine, obs.engine)


def _ollama_settings(obs: Observation, values: dict[str, Any]) -> None:
    """The runner's `--ctx-size` is num_ctx x num_parallel; num_ctx is the per-sequence context."""
    parallel = values.get("parallel") or 1
    ctx = values.pop("ctx_size", None)
    if ctx and "max_model_len" not in values:
        values["max_model_len"] = int(ctx) // int(parallel)
    for key in ("n_ubatch", "flash_attn"):
        values.pop(key, None)  # Ollama's environment decides these, not the runner's flags
    if obs.extra.get("layers_requested") not in (None, -1):
        values["n_gpu_layers"] = obs.extra["layers_requested"]
    if not obs.engine_version and "engine_version" not in values:
        # Only releases up to v0.12.10 print the estimate line (llm/memory.go): plan the estimator modelled, not the
        # default release, which runs llama-server and estimates nothing.
        values["engine_version"] = OLLAMA_ESTIMATOR_RELEASE


def settings_for(obs: Observation, **overrides: Any) -> EngineSettings:
    """The engine settings the observation printed; the rest stay at the engine's defaults."""
    engine = model_engine(obs)
    values: dict[str, Any] = {k: v for k, v in obs.settings.items() if k in _SETTING_FIELDS and v is not None}
    values.pop("engine", None)
    if engine == "ollama":
        _ollama_settings(obs, values)
    elif engine == "llama.cpp":
        values.update({k: v for k, v in llamacpp_placement(obs).items() if k not in values})
    elif obs.engine == "ollama":
        values.pop("engine_version", None)  # Ollama's release number is not llama.cpp's build
    if obs.max_model_len and engine in ("vllm", "tgi") and "max_model_len" not in values:
        values["max_model_len"] = obs.max_model_len
    if obs.engine_version and (obs.engine != "ollama" or engine == "ollama"):
        values.setdefault("engine_version", obs.engine_version)
    if engine == "sglang" and values.get("gpu_memory_utilization") is not None:
        values.setdefault("mem_fraction_static", values.pop("gpu_memory_utilization"))
    if engine == "tgi":
        values.pop("gpu_memory_utilization", None)  # TGI's cuda_memory_fraction is not vLLM's budget
    values.update({k: v for k, v in overrides.items() if v is not None})
    if values.get("limit_mm_per_prompt") is not None:  # JSON gives lists back
        values["limit_mm_per_prompt"] = tuple((str(k), int(v)) for k, v in values["limit_mm_per_prompt"])
    try:
        return EngineSettings(engine=engine, **values)
    except TypeError as exc:
        raise ConfigError(f"settings from the log do not fit: {exc}") from None


@dataclass(frozen=True)
class Row:
    field: str
    observed: float | None
    predicted: float | None

    @property
    def difference(self) -> float | None:
        if self.observed is None or self.predicted is None:
            return None
        return self.predicted - self.observed

    @property
    def relative(self) -> float | None:
        d = self.difference
        if d is None or not self.observed:
            return None
        return d / abs(self.observed)


@dataclass(frozen=True)
class Comparison:
    observation: Observation
    estimate: Estimate
    gpu_reason: str
    rows: tuple[Row, ...]
    contributions: dict[str, float]  # component -> bytes it moves the KV prediction by
    explains: str | None  # the component with the largest contribution

    def to_json(self) -> dict[str, Any]:
        pred = self.estimate.to_json()
        pred["difference"] = {r.field: r.difference for r in self.rows if r.difference is not None}
        pred["relative_difference"] = {
            r.field: round(r.relative, 5) for r in self.rows if r.relative is not None
        }
        pred["kv_difference_by_component"] = {k: int(v) for k, v in self.contributions.items()}
        pred["explained_by"] = self.explains
        pred["gpu_choice"] = self.gpu_reason
        devices = pred.get("devices")
        rank = self.observation.rank
        if self.estimate.engine == "llama.cpp" and isinstance(devices, list) and len(devices) > 1:
            if rank is not None and rank < len(devices):  # `difference` is this rank's device's buffers
                pred["compared_device"] = devices[rank]["device"]
        return pred


# Ollama's estimate line, field by field: what its own `msg=offload` line prints.
OLLAMA_FIELD = {
    "weights_bytes": "memory_weights_total_bytes",
    "kv_cache_bytes": "memory_required_kv_bytes",
    "extra.required_bytes": "memory_required_partial_bytes",
}


# llama.cpp prints each device's buffers; the plan's per-device table has the same three.
DEVICE_FIELD = {
    "weights_bytes": "model_buffer_bytes",
    "kv_cache_bytes": "kv_buffer_bytes",
    "activation_peak_bytes": "compute_buffer_bytes",
}


def predicted_value(est: Estimate, field: str, rank: int | None = None) -> float | None:
    devices = est.extra.get("devices") if est.engine == "llama.cpp" else None
    if isinstance(devices, list) and len(devices) > 1 and rank is not None and field in DEVICE_FIELD:
        return devices[rank][DEVICE_FIELD[field]] if rank < len(devices) else None
    ollama: dict[str, float] | None = est.extra.get("ollama") if est.engine == "ollama" else None
    if ollama is not None:
        if field == "activation_peak_bytes":
            full = ollama["layers_offload"] >= ollama["layers_model"]
            return ollama["memory_graph_full_bytes" if full else "memory_graph_partial_bytes"]
        if field == "layers_offloaded":
            return ollama["layers_offload"]
        return ollama.get(OLLAMA_FIELD.get(field, ""), None)
    if field == "kv_cache_bytes":  # signed, as vLLM prints "Available KV cache memory" for a failed start-up
        return est.kv_available_bytes
    if field == "kv_cache_tokens":
        return est.kv_cache_tokens
    if field == "max_concurrency":
        return est.max_concurrency
    name = next((k for k, v in COMPONENT_FIELD.items() if v == field), None)
    comp = est.component(name) if name else None
    return comp.bytes if comp is not None else None


def compare(obs: Observation, est: Estimate, gpu_reason: str = "") -> Comparison:
    rows = tuple(Row(f, getattr(obs, f), predicted_value(est, f, obs.rank)) for f in ROWS)
    if est.engine == "ollama":  # its own decision: the layers it offloads and the GPU total it expects
        rows += (
            Row(
                "layers_offloaded",
                obs.extra.get("layers_offloaded"),
                predicted_value(est, "layers_offloaded"),
            ),
            Row(
                "extra.required_bytes",
                obs.extra.get("required_bytes"),
                predicted_value(est, "extra.required_bytes"),
            ),
        )
    contributions: dict[str, float] = {}
    for comp in est.components if est.engine != "ollama" else ():  # Ollama's KV is not a leftover
        field = COMPONENT_FIELD.get(comp.name)
        if not comp.in_budget or field is None or field == "kv_cache_bytes":
            continue
        seen = getattr(obs, field)
        if seen is not None:
            # Predicting a component X bytes too high predicts the KV pool X bytes too low.
            planned = predicted_value(est, field, obs.rank)  # llama.cpp: this device's buffer
            contributions[comp.name] = -((comp.bytes if planned is None else planned) - seen)
    seen_budget: float | None = obs.budget_bytes
    if seen_budget is None and obs.total_gpu_memory_bytes and obs.gpu_memory_utilization:
        seen_budget = obs.total_gpu_memory_bytes * obs.gpu_memory_utilization
    if seen_budget is not None:
        contributions["budget"] = est.budget_bytes - seen_budget
    kv = next(r for r in rows if r.field == "kv_cache_bytes").difference
    if kv is not None and contributions:
        contributions["unexplained"] = kv - sum(contributions.values())
    # "unexplained" wins when the printed components do not account for the KV difference:
    # the budget or a component the log does not print is off.
    explains = max(contributions, key=lambda k: abs(contributions[k])) if contributions else None
    return Comparison(obs, est, gpu_reason, rows, contributions, explains)


@dataclass(frozen=True)
class Attribution:
    group: str
    n: int
    median_kv_error: float  # relative, |error|
    main_component: str | None
    share: float  # that component's share of the summed |contributions|


def _tags(c: Comparison) -> list[str]:
    s = c.estimate.settings
    m_tags = ["all"]
    if c.estimate.extra.get("vision") or any("multimodal" in comp.note for comp in c.estimate.components):
        m_tags.append("models with vision encoders")
    if int(s.get("tensor_parallel_size") or 1) > 1:
        m_tags.append("tensor parallel > 1")
    if int(s.get("pipeline_parallel_size") or 1) > 1:
        m_tags.append("pipeline parallel > 1")
    if "fp8" in str(s.get("kv_cache_dtype") or ""):
        m_tags.append("fp8 KV cache")
    if s.get("quantization"):
        m_tags.append("quantized weights")
    if any("MoE" in comp.note for comp in c.estimate.components):
        m_tags.append("MoE models")
    mode = s.get("engine_mode")
    if mode:
        m_tags.append(f"{c.estimate.engine} {mode}")
    return m_tags


def attribute(comparisons: list[Comparison]) -> list[Attribution]:
    """Over a set: per group of observations, which component most of the KV error comes from."""
    groups: dict[str, list[Comparison]] = {}
    for c in comparisons:
        for tag in _tags(c):
            groups.setdefault(tag, []).append(c)
    out = []
    for tag, items in groups.items():
        totals: dict[str, float] = {}
        errors = []
        for c in items:
            for k, v in c.contributions.items():
                totals[k] = totals.get(k, 0.0) + abs(v)
            rel = next(r for r in c.rows if r.field == "kv_cache_bytes").relative
            if rel is not None:
                errors.append(abs(rel))
        whole = sum(totals.values())
        main = max(totals, key=lambda k: totals[k]) if totals else None
        out.append(
            Attribution(
                tag,
                len(items),
                statistics.median(errors) if errors else float("nan"),
                main,
                (totals[main] / whole) if main and whole else 0.0,
            )
        )
    return out


def attribution_sentences(attrs: list[Attribution]) -> list[str]:
    lines = []
    for a in attrs:
        if a.main_component is None or a.n == 0:
            continue
        where = "" if a.group == "all" else f" on {a.group}"
        lines.append(
            f"most KV error{where} comes from {a.main_component} "
            f"({a.share:.0%} of it; n={a.n}, median |KV error| {a.median_kv_error:.1%})"
        )
    return lines


__all__ = [
    "COMPONENT_FIELD",
    "Comparison",
    "Row",
    "attribute",
    "attribution_sentences",
    "compare",
    "gpu_for",
    "model_engine",
    "predicted_value",
    "settings_for",
]
