"""`check-log` as a library call: parse a log, predict each start-up, compare, attribute."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlab.errors import ConfigError, VramlabError
from vramlab.logs.compare import Comparison, attribute, attribution_sentences, compare, gpu_for, settings_for
from vramlab.logs.detect import parse_log
from vramlab.logs.observation import Observation


@dataclass
class Item:
    observation: Observation
    comparison: Comparison | None = None
    error: str | None = None  # why there is no prediction
    settings_used: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckReport:
    source: str
    engine: str
    lines: int
    items: list[Item]
    incomplete: list[Observation]
    summary: list[str]

    def to_json(self) -> dict[str, Any]:
        observations = []
        for it in self.items:
            o = it.observation.model_dump(mode="json", exclude_none=True)
            if it.comparison is not None:
                o["prediction"] = it.comparison.to_json()
            else:
                o["prediction"] = None
                o["prediction_error"] = it.error
            observations.append(o)
        return {
            "source": self.source,
            "engine": self.engine,
            "observations": observations,
            "incomplete": [o.model_dump(mode="json", exclude_none=True) for o in self.incomplete],
            "summary": self.summary,
        }


def predict(obs: Observation, model: str | None = None, gpu: str | None = None,
            engine_version: str | None = None, constants: Any = None, offline: bool = True,
            spec: Any = None) -> Item:
    """Predict one observation's start-up. Missing facts become the item's `error`."""
    from vramlab.capacity import estimate

    name = model or obs.model
    if spec is None:
        if not name:
            return Item(obs, error="the log does not name the model; pass --model")
        spec, why = _resolve(name, offline)
        if spec is None:
            return Item(obs, error=why)
    try:
        card, reason = gpu_for(obs, gpu)
        settings = settings_for(obs, engine_version=engine_version)
        est = estimate(spec, card, settings, constants)
    except VramlabError as exc:
        return Item(obs, error=str(exc))
    except (ImportError, NotImplementedError):  # a policy the capacity model does not have yet
        return Item(obs, error=f"the capacity model has no policy for {settings_for(obs).engine} yet")
    used = {k: v for k, v in settings.explicit().items() if k != "engine"}
    return Item(obs, compare(obs, est, reason), settings_used=used)


def _resolve(name: str, offline: bool) -> tuple[Any, str]:
    """The model a log names. llama.cpp prints GGUF's `general.name` ('Qwen3 30B A3B'), so the
    catalog's dashed spelling is tried too."""
    from vramlab.sources import resolve_model

    first_error = ""
    for cand in dict.fromkeys([name, name.strip().lower().replace(" ", "-")]):
        try:
            return resolve_model(cand, offline=offline), ""
        except VramlabError as exc:
            first_error = first_error or str(exc)
    if offline and "offline" in first_error:
        return None, (f"model {name!r} is not in the bundled catalog; pass --model (a catalog name or a local "
                      "config.json / model directory) or --online to read it from the Hugging Face Hub")
    return None, f"model {name!r}: {first_error}"


def check_log(path: str | Path, model: str | None = None, gpu: str | None = None, engine: str | None = None,
              engine_version: str | None = None, calibration: str | Path | None = None,
              offline: bool = True) -> CheckReport:
    parsed = parse_log(path, engine)
    if not parsed.observations:
        raise ConfigError(f"{path}: the log ends before the engine sized its KV cache (no complete start-up)")
    profile = None
    if calibration:
        from vramlab.logs.profile import load_profile

        profile = load_profile(calibration)
    items = []
    for obs in parsed.observations:
        constants = None
        if profile is not None:
            from vramlab.capacity.calibration import apply_profile
            from vramlab.capacity.constants import Constants
            from vramlab.logs.compare import MODEL_ENGINE

            constants = apply_profile(Constants.defaults(), profile, MODEL_ENGINE.get(obs.engine, obs.engine),
                                      engine_version or obs.engine_version)
        items.append(predict(obs, model, gpu, engine_version, constants, offline))
    done = [it for it in items if it.comparison is not None]
    if not done:
        # Nothing could be predicted: one line naming what is missing is all a user needs.
        raise ConfigError(f"{path}: {items[0].error}")
    summary = attribution_sentences(attribute([it.comparison for it in done if it.comparison]))
    # With one start-up the per-observation line already says it; the summary is for sets.
    distinct = {repr(it.observation.measured()) for it in done}
    return CheckReport(str(path), parsed.engine, parsed.lines, items, parsed.incomplete,
                       summary if len(distinct) > 1 else [])
