"""`vramlab calibrate` as a library call: read logs and measurement files, fit per engine,
attribute the remaining error, build a profile. File writing is left to the caller."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vramlab import __version__
from vramlab.capacity.calibration import Fit, fit, profile_from_fits
from vramlab.capacity.calibration_result import CalibrationResult, EraRow
from vramlab.errors import ConfigError, VramlabError
from vramlab.logs.cases import build_cases
from vramlab.logs.observation import Observation, read_observations

# No card has this much memory: a figure above it is a misread or a corrupt line.
_LARGEST_CARD_BYTES = 1 << 40
_BYTE_FIELDS = (
    "weights_bytes",
    "kv_cache_bytes",
    "activation_peak_bytes",
    "non_torch_bytes",
    "init_non_torch_bytes",
    "cuda_graph_bytes",
    "non_kv_cache_bytes",
    "budget_bytes",
)


# No engine allocates a component smaller than this: engines print GiB or MiB with two decimals, and
# the smallest real buffers are tenths of a MiB (a tiny test model's q8_0 KV cache: llama.cpp printed
# `KV buffer size = 0.53 MiB`). A figure of a few bytes is a unit slip (bytes for GiB) and would drag a
# fitted constant anywhere.
_SMALLEST_COMPONENT_BYTES = 64 << 10
# A served model has weights and a KV cache: zero is a failed start-up, not a measurement.
_NEVER_ZERO = ("weights_bytes", "kv_cache_bytes")


def _too_small(obs: Observation) -> str | None:
    for name in _BYTE_FIELDS:
        value = getattr(obs, name)
        if value is None:
            continue
        if value == 0 and name in _NEVER_ZERO:
            return f"{name} is 0: a served model has one (a failed start-up is not a measurement)"
        if 0 < value < _SMALLEST_COMPONENT_BYTES:
            return (
                f"{name} is {value:,} bytes, smaller than any buffer an engine allocates (64 KiB); "
                "a unit slip (bytes for GiB)?"
            )
    return None


def implausible_bytes(name: str, value: object, card_bytes: int | None, component: bool = True) -> str | None:
    """Why one stored byte figure cannot be a measurement, by the rules `impossible` applies to a
    log's or a JSONL line's: a number of bytes (not true/false), finite, not negative, not bigger
    than the card, and for a component at least 64 KiB."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} is {value!r}, not a number of bytes"
    if not math.isfinite(value):
        return f"{name} is not a finite number ({value})"
    if value < 0:
        return f"{name} is negative ({value:,.0f}): not a measurement of one component"
    if component and value < _SMALLEST_COMPONENT_BYTES:
        return (
            f"{name} is {value:,.0f} bytes, smaller than any buffer an engine allocates (64 KiB); "
            "a unit slip (bytes for GiB)?"
        )
    limit = card_bytes or _LARGEST_CARD_BYTES
    if value > limit:
        what = f"the card's {card_bytes / (1 << 30):.2f} GiB" if card_bytes else "any card's memory"
        return f"{name} {value / (1 << 30):.4g} GiB is bigger than {what}"
    return None


def impossible(obs: Observation) -> str | None:
    """Why an observation cannot be a measurement of one GPU, or None. Non-finite, negative or
    bigger-than-the-card figures would drag a fit anywhere; V0's negative figures (another
    process freed memory during profiling) are real log lines but not measurements of a component."""
    import math

    for name in (
        *_BYTE_FIELDS,
        "kv_cache_tokens",
        "gpu_blocks",
        "max_concurrency",
        "gpu_memory_utilization",
        "total_gpu_memory_bytes",
    ):
        value = getattr(obs, name)
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            return f"{name} is not a finite number ({value})"
        if value < 0:
            return f"{name} is negative ({value:,}): not a measurement of one component"
    small = _too_small(obs)
    if small:
        return small
    util = obs.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        return f"gpu_memory_utilization {util} is outside (0, 1]"
    card = obs.total_gpu_memory_bytes
    limit = card if card else _LARGEST_CARD_BYTES
    for name in _BYTE_FIELDS:
        value = getattr(obs, name)
        if value is not None and value > limit:
            what = f"the card's {card / (1 << 30):.2f} GiB" if card else "any card's memory"
            return f"{name} {value / (1 << 30):.2f} GiB is bigger than {what}"
    return None


def read_inputs(paths: Sequence[str | Path]) -> tuple[list[Observation], list[tuple[str, str]]]:
    """Observations from logs (any engine), JSONL files and folders of both; unreadable logs and
    physically impossible observations are reported, never used."""
    from vramlab.logs.check import log_files
    from vramlab.logs.pieces import read_file
    from vramlab.logs.reader import read_log, read_notes

    out: list[Observation] = []
    problems: list[tuple[str, str]] = []
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(log_files([path]))
            files.extend(sorted(f for f in path.rglob("*.jsonl") if not f.name.startswith(".")))
        else:
            files.append(path)
    for path in dict.fromkeys(files):
        found: list[Observation]
        if path.suffix == ".jsonl":
            found = read_observations(path)  # a bad measurement line stops: it would bias the fit
        else:
            try:  # every log the file holds (writers, servers, engines: logs/pieces.py)
                lines = read_log(path)
                read = read_file(str(path), lines, None, read_notes(lines))
            except VramlabError as exc:
                problems.append((str(path), str(exc)))
                continue
            problems.extend(read.skipped)
            found = [o for piece in read.pieces for o in piece.parsed.observations]
            problems.extend(
                (piece.label, "incomplete start-up (log ends early)")
                for piece in read.pieces
                for _ in piece.parsed.incomplete
            )
        for obs in found:
            why = impossible(obs)
            if why is not None:
                label = obs.source or str(path)
                problems.append(
                    (label + (f" rank {obs.rank}" if obs.rank is not None else ""), f"rejected: {why}")
                )
                continue
            out.append(obs)
    return out, problems


def _version_override(fits: list[Fit], versions: str | None) -> list[Fit]:
    if not versions:
        return fits
    lo, sep, hi = versions.partition("..")
    if not sep:
        raise ConfigError(f"--versions wants MIN..MAX (e.g. 0.10..0.29), got {versions!r}")
    from dataclasses import replace

    from vramlab.capacity.validation import check_version_range

    check_version_range(
        lo or None, hi or None, "--versions"
    )  # 0.29..0.10 is refused, not a profile no plan matches

    return [replace(f, version_min=lo or None, version_max=hi or None) for f in fits]


def calibrate(
    paths: Sequence[str | Path],
    model_configs: str | Path | None = None,
    engine: str | None = None,
    min_points: int = 3,
    versions: str | None = None,
    offline: bool = True,
    name: str = "calibration",
) -> CalibrationResult:
    observations, skipped = read_inputs(paths)
    if not observations:
        raise ConfigError(
            "no usable observation in the inputs"
            + (f" ({skipped[0][0]}: {skipped[0][1]})" if skipped else "")
        )
    configs: dict[str, Any] | None = None
    if model_configs:
        from vramlab.infile import read_text

        text = read_text(
            model_configs, "--model-configs", expect="expected a JSON object: hf id -> config.json"
        )
        try:
            configs = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"--model-configs {model_configs}: not JSON ({exc.msg}, line {exc.lineno})"
            ) from None
        except RecursionError:
            raise ConfigError(f"--model-configs {model_configs}: nested too deeply") from None
        if not isinstance(configs, dict) or not all(isinstance(v, dict) for v in configs.values()):
            raise ConfigError(
                f"--model-configs {model_configs}: expected a JSON object of hf id -> config.json object"
            )
    by_engine, more = build_cases(observations, configs, offline)
    skipped += more
    if engine:
        by_engine = {k: v for k, v in by_engine.items() if k == engine}
    if not by_engine:
        raise ConfigError(
            "no observation could be matched to a model and a card"
            + (f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else "")
        )
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
    return CalibrationResult(
        fits,
        profile,
        len(observations),
        skipped,
        _attribution(observations, configs, offline),
        _outliers(fits, by_engine),
        _era_table(observations, by_engine, fits),
    )


def _outliers(fits: list[Fit], by_engine: dict[str, list[Any]]) -> list[str]:
    """Rows whose KV cache the fit (left out of it) misses by far more than the rest: worth a look
    (a wrong model, a card shared with another process, a misread log) before trusting the profile."""
    out = []
    for f in fits:
        seen = {c.label: c.observed for c in by_engine.get(f.engine, [])}
        errors: dict[str, float] = {}
        for label, pred in f.loo_predicted.items():
            observed = seen.get(label, {}).get("kv_cache_bytes")
            got = pred.get("kv_cache_bytes")
            if observed and got is not None:
                errors[label] = (got - observed) / observed
        if len(errors) < 4:
            continue
        typical = sorted(abs(e) for e in errors.values())[len(errors) // 2]
        for label, e in errors.items():
            if abs(e) > max(0.25, 5 * typical):
                out.append(
                    f"{f.engine}: {label}: KV cache predicted {e:+.0%} off without it (typical "
                    f"{typical:.1%}); check that row's model, card and log"
                )
    return out


def _era_table(
    observations: list[Observation], by_engine: dict[str, list[Any]], fits: list[Fit]
) -> list[EraRow]:
    """Observations per engine era: how many were read and how many the fit could use."""
    from vramlab.logs.era import era_of

    used = {c.label for cases in by_engine.values() for c in cases}
    not_predicted = {label for f in fits for label, _ in f.skipped}
    rows: dict[tuple[str, str], EraRow] = {}
    for obs in observations:
        era = era_of(obs)
        row = rows.setdefault(
            (obs.engine, era.label),
            {"engine": obs.engine, "era": era.label, "observations": 0, "used": 0, "inferred": era.inferred},
        )
        row["observations"] += 1
        label = (obs.source or obs.model or "observation") + (
            f" rank {obs.rank}" if obs.rank is not None else ""
        )
        row["used"] += label in used and label not in not_predicted
    return sorted(rows.values(), key=lambda r: (r["engine"], r["inferred"], r["era"]))


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
