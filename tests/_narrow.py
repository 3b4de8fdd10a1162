"""Helpers that let mypy check test bodies without weakening them.

`some(x)` is x with None ruled out: a None fails the test right there, with its own message, where the
next line would have raised a TypeError or AttributeError. `stand_in(...)` is a typed fake record.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, TypeVar

T = TypeVar("T")


def some(x: T | None) -> T:
    assert x is not None, "expected a value, got None"
    return x


def stand_in(**fields: Any) -> Any:
    """A SimpleNamespace typed Any: a stand-in for a record that the code under test only reads fields of."""
    return SimpleNamespace(**fields)
