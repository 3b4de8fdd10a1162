"""Observations -> calibration cases: resolve each one's model, card and settings.

The model comes from a `model_configs.json` map (hf id -> config.json fields, as in
vramlab's data set) when given, else from `resolve_model` (catalog, local path, cached Hub).
An observation that cannot be resolved is listed with the reason, never silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vramlab.capacity.calibration import Case
from vramlab.capacity.spec import ModelSpec
from vramlab.errors import VramlabError
from vramlab.logs.compare import MODEL_ENGINE, gpu_for, settings_for
from vramlab.logs.observation import Observation


def _quantization(obs: Observation, spec: ModelSpec) -> str | None:
    """The scheme the engine loaded. Logs print the container ('compressed-tensors'), and
    borrowed base configs lack the checkpoint's quantization_config; the checkpoint name
    tells the scheme (RedHatAI '...quantized.w8a8', '-fp8-dynamic', AWQ/GPTQ)."""
    q = str(obs.settings.get("quantization") or "").lower() or None
    if q is None or spec.quant is not None:
        return q
    name = (obs.model or "").lower()
    for pattern, scheme in (
        (r"w4a16|int4|4bit", "w4a16"),
        (r"awq", "awq"),
        (r"w8a8|int8", "w8a8"),
        (r"fp8", "fp8"),
    ):
        if re.search(pattern, name):
            return "awq" if scheme == "awq" else scheme
    return "gptq" if q in ("gptq_marlin", "gptq") else q


def resolve_spec(name: str, configs: Mapping[str, Any] | None, offline: bool) -> ModelSpec:
    last: VramlabError | None = None
    if configs and isinstance(configs.get(name), dict) and configs[name].get("source") is not None:
        from vramlab.sources.hf_config import spec_from_config

        try:
            return spec_from_config(configs[name], name, str(configs[name].get("source")), hf_id=name)
        except VramlabError as exc:  # a partial copy: the catalog may know the model whole
            last = exc
    from vramlab.sources import resolve_model

    alias = (
        (configs or {}).get(name, {}).get("config_of")
        if isinstance((configs or {}).get(name), dict)
        else None
    )
    from vramlab.logs.check import model_candidates
    from vramlab.sources.catalog import find_entry

    for cand in model_candidates(name):
        entry = find_entry(cand)
        if entry is not None:
            return entry.spec()
    for cand in dict.fromkeys(c for c in (name, alias, name.strip().lower().replace(" ", "-")) if c):
        try:
            return resolve_model(cand, offline=offline)
        except VramlabError as exc:
            last = last or exc
    if offline and last is not None and "offline" in str(last):
        # The resolver speaks of `plan --offline`; calibrate's switch is the other way round.
        raise VramlabError(
            f"model {name!r} is not in the bundled catalog; pass --online to read its config from "
            "the Hugging Face Hub, or --model-configs with a config.json map"
        ) from None
    raise last or VramlabError(f"cannot resolve model {name!r}")


def observation_case(
    obs: Observation,
    configs: Mapping[str, Any] | None = None,
    offline: bool = True,
    model: str | None = None,
    gpu: str | None = None,
) -> Case:
    """A calibration case for one observation; VramlabError says what is missing."""
    name = model or obs.model
    if not name:
        raise VramlabError("no model named (pass --model)")
    spec = resolve_spec(name, configs, offline)
    card, _ = gpu_for(obs, gpu)
    settings = settings_for(obs)
    q = _quantization(obs, spec)
    if q != settings.quantization:
        settings = settings.with_(quantization=q)
    observed = {k: float(v) for k, v in obs.measured().items()}
    if obs.init_non_torch_bytes is not None:
        observed["init_non_torch_bytes"] = float(obs.init_non_torch_bytes)
    label = obs.source or obs.model or "observation"
    if obs.rank is not None:
        label += f" rank {obs.rank}"
    return Case(label, spec, card, settings, observed)


def build_cases(
    observations: Sequence[Observation],
    configs: Mapping[str, Any] | None = None,
    offline: bool = True,
    model: str | None = None,
    gpu: str | None = None,
) -> tuple[dict[str, list[Case]], list[tuple[str, str]]]:
    """Cases grouped by the engine the capacity model predicts for, and the skipped ones."""
    by_engine: dict[str, list[Case]] = {}
    skipped: list[tuple[str, str]] = []
    for obs in observations:
        label = obs.source or obs.model or "observation"
        if obs.basis != "measured":
            skipped.append((label, "an engine's own estimate, not a measurement"))
            continue
        try:
            case = observation_case(obs, configs, offline, model, gpu)
        except VramlabError as exc:
            skipped.append((label, str(exc)))
            continue
        by_engine.setdefault(MODEL_ENGINE.get(obs.engine, obs.engine), []).append(case)
    return by_engine, skipped
