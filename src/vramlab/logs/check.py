"""`check-log` as a library call: parse a log, say what the engine decided, predict the same
start-up when the model resolves, compare, attribute.

Parsing never needs the model, the GPU or the version: a parsed log always yields its
observations (and failures). The prediction beside each one is added when the model (from the
log or `--model`) and the card (the log's total memory or `--gpu`) resolve; otherwise the item
carries one line saying what is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlab.errors import ConfigError, VramlabError
from vramlab.logs.compare import Comparison, attribute, attribution_sentences, compare, gpu_for, settings_for
from vramlab.logs.detect import parse_log
from vramlab.logs.era import Era, era_of
from vramlab.logs.models import _resolve, model_candidates, model_for
from vramlab.logs.observation import Observation
from vramlab.logs.refusal import refusal_lines


@dataclass
class Item:
    observation: Observation
    comparison: Comparison | None = None
    error: str | None = None  # why there is no prediction
    settings_used: dict[str, Any] = field(default_factory=dict)
    era: Era | None = None
    refusal: list[str] = field(default_factory=list)  # a refused start-up beside the plan (logs/refusal.py)
    notes: list[str] = field(
        default_factory=list
    )  # how the prediction was made, where it is not the usual way

    def era_or_inferred(self) -> Era:
        """The era given, else the one the observation's wording implies."""
        return self.era or era_of(self.observation)


@dataclass
class CheckReport:
    source: str
    engine: str
    lines: int
    items: list[Item]  # every start-up and rank with figures; `observation.complete` tells which
    summary: list[str]
    failures: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)  # per failure: "start-up" | "serving"

    def to_json(self) -> dict[str, Any]:
        observations = []
        for it in self.items:
            o = _obs_json(it.observation, it.era)
            if it.comparison is not None:
                o["prediction"] = it.comparison.to_json()
                if it.refusal:
                    o["prediction"]["refusal"] = it.refusal
                if it.notes:
                    o["prediction"]["notes"] = it.notes
            else:
                o["prediction"] = None
                o["prediction_error"] = it.error
            observations.append(o)
        return {
            "source": self.source,
            "engine": self.engine,
            "observations": observations,
            "failures": [
                _failure_json(f) | ({"during": ph} if ph else {})
                for f, ph in zip(self.failures, self.phases or [""] * len(self.failures), strict=False)
            ],
            "notes": self.notes,
            "summary": self.summary,
        }


def _obs_json(obs: Observation, era: Era | None) -> dict[str, Any]:
    out = obs.model_dump(mode="json", exclude_none=True)
    if era is not None:
        out["era"] = era.to_json()
    return out


def _failure_json(sig: Any) -> dict[str, Any]:
    out = {
        "kind": sig.kind,
        "name": sig.name,
        "engine": sig.engine,
        "severity": sig.severity,
        "line_number": sig.line_number,
        "line": sig.line[:500],
    }
    if sig.details:
        out["details"] = sig.details
    return out


def predict(
    obs: Observation,
    model: str | None = None,
    gpu: str | None = None,
    engine_version: str | None = None,
    constants: Any = None,
    offline: bool = True,
    spec: Any = None,
    era: Era | None = None,
    quantization: str | None = None,
) -> Item:
    """Predict one observation's start-up. What is missing (the model, the card, or both) becomes the
    item's `error`, one clause per missing fact with the flag that fills it."""
    from vramlab.capacity import estimate

    notes: list[str] = []
    missing: list[str] = []
    if spec is None:
        spec, why, notes = model_for(obs, model, offline, quantization)
        if spec is None:
            missing.append(why)
    card, reason = None, ""
    try:
        card, reason = gpu_for(obs, gpu)
    except VramlabError as exc:
        missing.append(str(exc))
    if missing or card is None:
        return Item(obs, error="; ".join(missing), era=era)
    try:
        overrides: dict[str, Any] = {"engine_version": engine_version, "quantization": quantization}
        if engine_version is None and not obs.engine_version and era is not None and era.version_hint:
            overrides["engine_version"] = era.version_hint  # the era's first release, said in the settings
        if era is not None and era.vllm_engine and not obs.settings.get("vllm_engine"):
            overrides["vllm_engine"] = era.vllm_engine
        settings = settings_for(obs, **overrides)
        est = estimate(spec, card, settings, constants)
    except VramlabError as exc:
        return Item(obs, error=str(exc), era=era)
    except (ImportError, NotImplementedError):  # a policy the capacity model does not have yet
        return Item(
            obs, error=f"the capacity model has no policy for {settings_for(obs).engine} yet", era=era
        )
    used = {k: v for k, v in settings.explicit().items() if k != "engine"}

    def longest() -> int:  # vLLM's "estimated maximum model length": the longest one request fits
        from vramlab.capacity import max_len_that_fits

        return max_len_that_fits(spec, card, settings.with_(max_model_len=None), constants)

    return Item(
        obs,
        compare(obs, est, reason),
        settings_used=used,
        era=era,
        refusal=refusal_lines(obs, est, longest),
        notes=notes,
    )


def check_log(
    path: str | Path,
    model: str | None = None,
    gpu: str | None = None,
    engine: str | None = None,
    engine_version: str | None = None,
    calibration: str | Path | None = None,
    offline: bool = True,
    max_bytes: int | None = None,
    quantization: str | None = None,
) -> CheckReport:
    """One log. Raises ConfigError only when nothing in it is recognizable."""
    return _check(
        parse_log(path, engine, max_bytes),
        str(path),
        model,
        gpu,
        engine_version,
        calibration,
        offline,
        quantization,
    )


def check_file(
    path: str | Path,
    model: str | None = None,
    gpu: str | None = None,
    engine: str | None = None,
    engine_version: str | None = None,
    calibration: str | Path | None = None,
    offline: bool = True,
    max_bytes: int | None = None,
    quantization: str | None = None,
) -> tuple[list[CheckReport], list[tuple[str, str]]]:
    """One file, read as the logs it holds (logs/pieces.py): a report per writer, per server of
    several writing at once and per engine, each with the file's line numbers; and (label, why)
    for what holds no log of a known engine. A file of one engine and writer is one report."""
    from vramlab.logs.pieces import read_file
    from vramlab.logs.reader import read_log, read_notes

    lines = read_log(path, max_bytes)
    found = read_file(str(path), lines, engine, read_notes(lines, max_bytes))
    reports = []
    for piece in found.pieces:
        parsed = piece.parsed
        parsed.notes = parsed.notes + piece.notes
        reports.append(
            _check(parsed, piece.label, model, gpu, engine_version, calibration, offline, quantization)
        )
    return reports, found.skipped


def _check(
    parsed: Any,
    label: str,
    model: str | None,
    gpu: str | None,
    engine_version: str | None,
    calibration: str | Path | None,
    offline: bool,
    quantization: str | None = None,
) -> CheckReport:
    profile = None
    if calibration:
        from vramlab.logs.profile import load_profile

        profile = load_profile(calibration)
    items = []
    # Complete start-ups and those the log cut short alike: the figures a cut-short start-up
    # printed (weights, a compute buffer) are still the engine's, and comparable.
    every = sorted(
        parsed.observations + parsed.incomplete,
        key=lambda o: (o.startup or 0, -1 if o.rank is None else o.rank),
    )
    for obs in every:
        constants = None
        if profile is not None:
            from vramlab.capacity.calibration import apply_profile
            from vramlab.capacity.constants import Constants
            from vramlab.logs.compare import model_engine

            constants = apply_profile(
                Constants.defaults(), profile, model_engine(obs), engine_version or obs.engine_version
            )
        items.append(
            predict(
                obs,
                model,
                gpu,
                engine_version,
                constants,
                offline,
                era=era_of(obs),
                quantization=quantization,
            )
        )
    done = [it for it in items if it.comparison is not None]
    summary = attribution_sentences(attribute([it.comparison for it in done if it.comparison]))
    # With one start-up the per-observation line already says it; the summary is for sets.
    distinct = {repr(it.observation.measured()) for it in done}
    return CheckReport(
        label,
        parsed.engine,
        parsed.lines,
        items,
        summary if len(distinct) > 1 else [],
        parsed.failures,
        parsed.notes,
        [parsed.phase(f) for f in parsed.failures],
    )


# --- many files -------------------------------------------------------------------------------

_NOT_LOGS = (".json", ".jsonl", ".toml", ".yaml", ".yml", ".md", ".py", ".csv", ".gz", ".zip", ".png", ".jpg")


def log_files(inputs: Sequence[str | Path], suffixes: tuple[str, ...] | None = None) -> list[Path]:
    """Files named, and every regular file under folders named (sorted, hidden ones skipped)."""
    out: list[Path] = []
    for raw in inputs:
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if suffixes is not None:
                found = [f for f in found if f.suffix in suffixes]
            else:  # a folder of logs: leave out what is plainly not a log (indexes, notes, code)
                found = [f for f in found if f.suffix.lower() not in _NOT_LOGS]
            out.extend(found)
        else:
            out.append(p)
    return list(dict.fromkeys(out))


@dataclass
class FolderReport:
    reports: list[CheckReport]
    skipped: list[tuple[str, str]]  # (file, why it was not read)

    def groups(self) -> dict[tuple[str, str], list[tuple[CheckReport, Item]]]:
        """Observations per (engine, era label), in file order."""
        out: dict[tuple[str, str], list[tuple[CheckReport, Item]]] = {}
        for rep in self.reports:
            for it in rep.items:
                era = it.era or era_of(it.observation)
                out.setdefault((rep.engine, era.label), []).append((rep, it))
        return dict(sorted(out.items(), key=lambda kv: kv[0]))

    def to_json(self) -> dict[str, Any]:
        tables = []
        for (engine, label), rows in self.groups().items():
            kv = [abs(r) for r in (_kv_relative(it) for _, it in rows) if r is not None]
            tables.append(
                {
                    "engine": engine,
                    "era": label,
                    "observations": len(rows),
                    "predicted": sum(1 for _, it in rows if it.comparison is not None),
                    "median_abs_kv_error": _median(kv),
                }
            )
        return {
            "files": [r.to_json() for r in self.reports],
            "skipped": [{"source": s, "reason": r} for s, r in self.skipped],
            "tables": tables,
        }


def _kv_relative(it: Item) -> float | None:
    if it.comparison is None:
        return None
    return next((r.relative for r in it.comparison.rows if r.field == "kv_cache_bytes"), None)


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def check_logs(inputs: Sequence[str | Path], **kwargs: Any) -> FolderReport:
    """Many logs (files and folders). A file that is not a log of a known engine is skipped with
    its reason; ConfigError when none was read."""
    files = log_files(inputs)
    if not files:
        raise ConfigError("no file found in " + ", ".join(str(i) for i in inputs))
    reports: list[CheckReport] = []
    skipped: list[tuple[str, str]] = []
    for f in files:
        try:
            got, left = check_file(f, **kwargs)
        except VramlabError as exc:
            skipped.append((str(f), str(exc)))
            continue
        reports.extend(got)
        skipped.extend(left)
    if not reports:
        raise ConfigError(
            f"none of the {len(files)} files is a log of a known engine (first: {skipped[0][1]})"
        )
    return FolderReport(reports, skipped)


__all__ = [
    "CheckReport",
    "FolderReport",
    "Item",
    "_resolve",
    "check_file",
    "check_log",
    "check_logs",
    "log_files",
    "model_candidates",
    "predict",
]
