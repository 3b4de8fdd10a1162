"""Whether an event's data fits the types its kind declares (records/event_payloads.py): the store reads a
misfit as absent and names it; the runner refuses to write one when ``VRAMLAB_STRICT_EVENTS`` is set (the test
suite sets it), so a writer whose payload drifts from its declaration fails where it writes."""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Literal, Union


@functools.cache
def _payload_hints(kind: str) -> dict[str, Any]:
    from vramlab.records.emit import PAYLOADS
    from vramlab.records.events import check_kind

    try:
        return typing.get_type_hints(PAYLOADS[check_kind(kind)])
    except (ValueError, KeyError):  # a kind this version does not know: its data is not read
        return {}


def misfits(kind: str, data: dict[str, Any]) -> list[str]:
    """The keys of an event's data whose values are not of the type its kind declares
    (vramlab.records.events): a reader would trip on them, so they are read as absent."""
    hints = _payload_hints(kind)
    return [k for k, v in data.items() if k in hints and not _fits(v, hints[k])]


def _fits(value: Any, hint: Any) -> bool:
    """A shallow check of a JSON value against a payload's declared type."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    shape = origin or hint
    if hint is type(None):
        return value is None
    if shape is bool:
        return isinstance(value, bool)
    if shape is int:
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if shape is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if shape is list:
        return isinstance(value, (list, tuple))  # a tuple written is a list read
    if shape in (str, dict):
        return isinstance(value, shape)
    return True  # Any, or a type a JSON value cannot be checked against here
