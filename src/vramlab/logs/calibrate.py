"""`vramlab calibrate` as a library call: read logs and measurement files, fit per engine,
attribute the remaining error, build a profile. File writing is left to the caller."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlab import __version__
from vramlab.capacity.calibration import Fit, Profile, fit, profile_from_fits
from vramlab.errors import ConfigError, VramlabError
from vramlab.logs.cases import build_cases
from vramlab.logs.observation import Observation, read_observations


@dataclass
class CalibrationResult:
    fits: list[Fit]
    profile: Profile
    observations: int
    skipped: list[tuple[str, str]]
    attribution: list[str] = field(default_factory=list)


def read_inputs(paths: Sequence[str | Path]) -> tuple[list[Observation], list[tuple[str, str]]]:
    """Observations from logs (any engine) and JSONL files; unreadable logs are reported."""
    from vramlab.logs.detect import parse_log

    out: list[Observation] = []
    problems: list[tuple[str, str]] = []
    for p in paths:
        path = Path(p)
        if path.suffix == ".jsonl":
            out.extend(read_observations(path))  # a bad measurement line stops: it would bias the fit
            continue
        try:
            parsed = parse_log(path)
        except VramlabError as exc:
            problems.append((str(path), str(exc)))
            continue
        out.extend(parsed.observations)
        problems.extend((str(path), "incomplete start-up (log ends early)") for _ in parsed.incomplete)
    return out, problems


def _version_override(fits: list[Fit], versions: str | None) -> list[Fit]:
    if not versions:
        return fits
    lo, sep, hi = versions.partition("..")
    if not sep:
        raise ConfigError(f"--versions wants MIN..MAX (e.g. 0.10..0.29), got {versions!r}")
    from dataclasses import replace

    return [replace(f, version_min=lo or None, version_max=hi or None) for f in fits]


def calibrate(paths: Sequence[str | Path], model_configs: str | Path | None = None, engine: str | None = None,
              min_points: int = 3, versions: str | None = None, offline: bool = True,
              name: str = "calibration") -> CalibrationResult:
    observations, skipped = read_inputs(paths)
    if not observations:
        raise ConfigError("no usable observation in the inputs"
                          + (f" ({skipped[0][0]}: {skipped[0][1]})" if skipped else ""))
    configs: dict[str, Any] | None = None
    if model_configs:
        try:
            configs = json.loads(Path(model_configs).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"--model-configs {model_configs}: {exc}") from None
    by_engine, more = build_cases(observations, configs, offline)
    skipped += more
    if engine:
        by_engine = {k: v for k, v in by_engine.items() if k == engine}
    if not by_engine:
        raise ConfigError("no observation could be matched to a model and a card"
                          + (f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""))
    fits = [fit(cases, eng, min_points=min_points) for eng, cases in sorted(by_engine.items())]
    fits = _version_override(fits, versions)
    for f in fits:
        skipped += [(label, f"the capacity model could not predict it: {why}") for label, why in f.skipped]
    provenance = {
        "tool": f"vramlab {__version__}",
        "inputs": [str(p) for p in paths],
        "observations": len(observations),
        "skipped": len(skipped),
        "method": "Huber then Tukey-bisquare regression on relative residuals, ridge-anchored to the defaults; "
                  "sensitivities from vramlab.capacity.estimate",
    }
    profile = profile_from_fits(name, fits, provenance)
    return CalibrationResult(fits, profile, len(observations), skipped, _attribution(observations, configs, offline))


def _attribution(observations: list[Observation], configs: dict[str, Any] | None, offline: bool) -> list[str]:
    """Per group of observations, the component most of the (default-constants) KV error comes from."""
    from vramlab.capacity import estimate
    from vramlab.logs.cases import observation_case
    from vramlab.logs.compare import attribute, attribution_sentences, compare

    comparisons = []
    for obs in observations:
        if obs.basis != "measured" or obs.kv_cache_bytes is None:
            continue
        try:
            case = observation_case(obs, configs, offline)
            comparisons.append(compare(obs, estimate(case.model, case.gpu, case.settings)))
        except (VramlabError, ImportError, NotImplementedError):
            continue
    return attribution_sentences(attribute(comparisons))
