"""Calibration profiles on disk (TOML). The maths and the structure are in
`vramlab.capacity.calibration`; this module only reads and writes files.

    profile = load_profile("my-fleet.calibration.toml")
    constants = apply_profile(Constants.defaults(), profile, "vllm", "0.19.0")
"""

from __future__ import annotations

from pathlib import Path

from vramlab.capacity.calibration import Profile, apply_profile, profile_from_dict, profile_to_toml
from vramlab.errors import ConfigError

__all__ = ["apply_profile", "load_profile", "write_profile"]


def load_profile(path: str | Path) -> Profile:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise ConfigError("reading calibration profiles needs Python 3.11 or newer (tomllib)") from None
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from None
    return profile_from_dict(data, p.name)


def write_profile(path: str | Path, profile: Profile) -> None:
    Path(path).write_text(profile_to_toml(profile), encoding="utf-8")
