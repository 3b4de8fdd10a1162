"""How numbers read in reports: units always printed, GiB = 2^30 bytes."""

from __future__ import annotations

import datetime as _dt

# the one GiB formatter ("–" for None), re-exported explicitly
from vramlab.units import GIB as GIB
from vramlab.units import gib as gib


def ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.1f}"


def pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.1f}%"


def rate(v: float | None) -> str:
    return "–" if v is None else f"{v:,.2f}"


def num(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:g}" if abs(v) < 1e6 else f"{v:.4g}"


def utc(epoch_s: float | None) -> str:
    if epoch_s is None:
        return "–"
    return _dt.datetime.fromtimestamp(epoch_s, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f} s"


def delta_ms(v: float | None) -> str:
    return "–" if v is None else f"{v:+,.1f}"
