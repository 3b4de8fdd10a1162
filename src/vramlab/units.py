"""Byte units, one place: figures are integers in bytes; people read them in GiB (2^30) or MiB
(2^20), always with the unit named beside the number.

    gib(12_884_901_888)                -> "12.00"
    gib(None)                          -> "–"      (a figure that is not known)
    gib(-3 * GIB, sign=True, unit=True) -> "-3.00 GiB"
"""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20
MISSING = "–"


def to_gib(nbytes: float) -> float:
    """Bytes as a (fractional) number of GiB."""
    return nbytes / GIB


def gib(nbytes: float | None, digits: int = 2, *, sign: bool = False, unit: bool = False) -> str:
    """Bytes printed in GiB with *digits* decimals; '+' on positive values with *sign*; ' GiB'
    appended with *unit*; MISSING for None."""
    if nbytes is None:
        return MISSING
    text = f"{nbytes / GIB:{'+' if sign else ''}.{digits}f}"
    return text + " GiB" if unit else text


SMALL_BYTES = GIB // 10  # below it, figures read in MiB: two GiB decimals would round them away


def size(nbytes: float | None, *, sign: bool = False) -> str:
    """Bytes with their unit: GiB, or MiB below SMALL_BYTES (a small model's buffers read
    "0.53 MiB", not "0.00 GiB"); MISSING for None."""
    if nbytes is None:
        return MISSING
    if nbytes and abs(nbytes) < SMALL_BYTES:
        return f"{nbytes / MIB:{'+' if sign else ''}.2f} MiB"
    return gib(nbytes, sign=sign, unit=True)


__all__ = ["GIB", "MIB", "MISSING", "SMALL_BYTES", "gib", "size", "to_gib"]
