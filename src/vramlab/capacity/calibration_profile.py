"""Calibration profiles: the fitted constants per engine and version range, read from and written as TOML
(by hand: the structure is small and fixed), and applied to the model's constants.

Pure: touches no file. `vramlab.sources.profile.load_profile` reads a profile file for `plan --calibration`;
`vramlab.logs.profile.write_profile` writes one. The fits come from `capacity.calibration.fit`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vramlab.capacity.constants import Constants
from vramlab.capacity.settings import DEFAULT_VERSIONS, parse_version
from vramlab.capacity.validation import check_version_range
from vramlab.errors import ConfigError

if TYPE_CHECKING:
    from vramlab.capacity.calibration import Fit


@dataclass(frozen=True)
class Section:
    engine: str
    version_min: str | None
    version_max: str | None
    constants: dict[str, dict[str, Any]]  # name -> {value, rel_band, source, n_points, default}
    loo: dict[str, dict[str, float]] = field(default_factory=dict)
    n_observations: int = 0


@dataclass(frozen=True)
class Profile:
    name: str
    sections: tuple[Section, ...]
    provenance: dict[str, Any] = field(default_factory=dict)


def profile_from_fits(name: str, fits: Sequence[Fit], provenance: Mapping[str, Any]) -> Profile:
    sections = []
    for f in fits:
        consts = {
            c.name: {
                "value": c.value,
                "rel_band": c.rel_band,
                "source": c.source,
                "n_points": c.n_points,
                "default": c.default,
                "target": c.target,
            }
            for c in f.fitted
        }
        loo = {
            e.field: {
                "n": e.n,
                "median_before": round(e.median_before, 5),
                "median_after": round(e.median_after, 5),
                "p90_before": round(e.p90_before, 5),
                "p90_after": round(e.p90_after, 5),
            }
            for e in f.loo
        }
        sections.append(Section(f.engine, f.version_min, f.version_max, consts, loo, f.n_cases))
    return Profile(name, tuple(sections), dict(provenance))


def profile_from_dict(data: Mapping[str, Any], name: str) -> Profile:
    """A profile from parsed TOML; a malformed one raises ConfigError naming the problem."""
    if data.get("format") != 1:
        raise ConfigError(f"{name}: not a vramlab calibration profile (format = 1 missing)")
    sections = []
    for k, sec in enumerate(data.get("section") or []):
        try:
            consts = {n: dict(v) for n, v in (sec.get("constants") or {}).items()}
            for v in consts.values():
                float(v["value"]), float(v["rel_band"]), str(v["source"])
            check_version_range(
                sec.get("version_min"), sec.get("version_max"), f"{name}: section {k + 1} versions"
            )
            sections.append(
                Section(
                    str(sec["engine"]),
                    sec.get("version_min"),
                    sec.get("version_max"),
                    consts,
                    dict(sec.get("loo") or {}),
                    int(sec.get("n_observations", 0)),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{name}: section {k + 1} is malformed ({exc})") from None
    if not sections:
        raise ConfigError(f"{name}: the profile has no [[section]]")
    return Profile(name, tuple(sections), dict(data.get("provenance") or {}))


def _pad(v: tuple[int, ...], n: int = 4) -> tuple[int, ...]:
    return v + (0,) * (n - len(v))


def select_section(profile: Profile, engine: str, version: str | None) -> Section:
    """The section fitted on this engine and a version range holding `version`; else ConfigError."""
    version = version or DEFAULT_VERSIONS.get(engine)
    mine = [s for s in profile.sections if s.engine == engine]
    if not mine:
        have = ", ".join(sorted({s.engine for s in profile.sections}))
        raise ConfigError(f"calibration profile {profile.name} was fitted on {have}, not {engine}")
    v = _pad(parse_version(version))
    for s in mine:
        lo = _pad(parse_version(s.version_min)) if s.version_min else None
        hi = _pad(parse_version(s.version_max)) if s.version_max else None
        if (lo is None or v >= lo) and (hi is None or v <= hi):
            return s
    ranges = "; ".join(f"{s.version_min or '?'}..{s.version_max or '?'}" for s in mine)
    raise ConfigError(
        f"calibration profile {profile.name} was fitted on {engine} {ranges}, not {engine} {version} "
        "(refit on logs of that version, or widen the range with `vramlab calibrate --versions`)"
    )


def apply_profile(constants: Constants, profile: Profile, engine: str, version: str | None) -> Constants:
    """Constants with the profile's fitted values for this engine and version (provenance 'calibrated')."""
    section = select_section(profile, engine, version)
    known = {k: v for k, v in section.constants.items() if k in constants.values}
    overrides = {k: (float(v["value"]), float(v["rel_band"]), str(v["source"])) for k, v in known.items()}
    return constants.with_overrides(overrides, profile.name)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else '"nan"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{s}"'


def profile_to_toml(profile: Profile) -> str:
    """The profile as TOML (written by hand: the structure is small and fixed)."""
    out = [
        "# vramlab calibration profile: fitted constants per engine and version range.",
        "# Apply with `vramlab plan --calibration FILE`; see docs/logs-and-calibration.md.",
        "format = 1",
        f"name = {_toml_value(profile.name)}",
        "",
        "[provenance]",
    ]
    out += [f"{k} = {_toml_value(v)}" for k, v in profile.provenance.items()]
    for s in profile.sections:
        out += ["", "[[section]]", f"engine = {_toml_value(s.engine)}"]
        if s.version_min:
            out.append(f"version_min = {_toml_value(s.version_min)}")
        if s.version_max:
            out.append(f"version_max = {_toml_value(s.version_max)}")
        out.append(f"n_observations = {s.n_observations}")
        for name, c in s.constants.items():
            out += ["", f"[section.constants.{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in c.items()]
        for fld, e in s.loo.items():
            out += ["", f"[section.loo.{fld}]"] + [f"{k} = {_toml_value(v)}" for k, v in e.items()]
    return "\n".join(out) + "\n"
