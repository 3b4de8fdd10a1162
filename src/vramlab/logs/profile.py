"""Calibration profiles on disk (TOML). The structure lives in `vramlab.capacity.calibration`,
the reader in `vramlab.sources.profile` (plan needs both without the log parsers); this module writes.

    profile = load_profile("my-fleet.calibration.toml")
    constants = apply_profile(Constants.defaults(), profile, "vllm", "0.19.0")
"""

from __future__ import annotations

from pathlib import Path

from vramlab.capacity.calibration import Profile, apply_profile, profile_to_toml
from vramlab.sources.profile import load_profile

__all__ = ["apply_profile", "load_profile", "write_profile"]


def write_profile(path: str | Path, profile: Profile) -> None:
    Path(path).write_text(profile_to_toml(profile), encoding="utf-8")
