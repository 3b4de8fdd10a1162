"""Byte units for the capacity package: the one definition lives in vramlab.units (below every package,
so analysis and records read the same GIB); this module keeps the capacity package's import path."""

from __future__ import annotations

from vramlab.units import GIB, MIB, MISSING, gib, to_gib

__all__ = ["GIB", "MIB", "MISSING", "gib", "to_gib"]
