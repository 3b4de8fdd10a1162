"""What `vramlab calibrate` over logs and measurement files found (logs/calibrate.py makes it, the
report's calibrate text renders it): the fits per engine, the profile, what was skipped and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from vramlab.capacity.calibration import Fit, Profile


class EraRow(TypedDict):
    """Observations of one engine era: how many were read, how many the fit could use."""

    engine: str
    era: str
    observations: int
    used: int
    inferred: bool  # the era inferred from the log's wording (no version printed)


@dataclass
class CalibrationResult:
    fits: list[Fit]
    profile: Profile
    observations: int
    skipped: list[tuple[str, str]]
    attribution: list[str] = field(default_factory=list)
    outliers: list[str] = field(default_factory=list)  # warnings: rows the fit is far off on
    eras: list[EraRow] = field(default_factory=list)  # one table row per engine era

    @property
    def fitted_any(self) -> bool:
        return any(f.fitted for f in self.fits)
