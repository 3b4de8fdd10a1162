"""Stored rows back into records, a corrupt row at a time.

A store is a file anyone can edit, and a database that outlived a bug can hold rows the record
contract refuses: a JSON column that is not JSON (or `null` where a document belongs), text in a
number column, a number no reading can have, a run of a kind vramlab does not know. One such row
must not cost the rest: it is left out (a run's own row is read with the broken field emptied
where the field has an empty value), and what was left out is named in `ReadProblems`, which the
commands print and the report carries among the run's notes.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from vramlab.records import RunRecord
from vramlab.records.event_check import misfits
from vramlab.records.store import ReadProblems


@functools.cache
def _list_adapter(model: Any) -> TypeAdapter[Any]:
    return TypeAdapter(list[model])


def decode_json(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """Parse the row's JSON columns (read as text) in place; marks the row ``_bad`` with every
    column that is not JSON (column -> why in ``_bad_columns``)."""
    bad: dict[str, str] = {}
    for name in columns:
        value = row.get(name)
        if isinstance(value, (bytes, bytearray)):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str):
            try:
                row[name] = json.loads(value)
            except ValueError:
                bad[name] = f"{name} is not JSON ({_short(value)})"
    if bad:
        row["_bad"], row["_bad_columns"] = "; ".join(bad.values()), bad
    return row


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err.get("loc", ()) if not isinstance(p, int)) or "row"
    return f"{where}: {err.get('msg', 'invalid')} ({_short(err.get('input'))})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def records(
    model: type[BaseModel], rows: list[dict[str, Any]], label: str, problems: ReadProblems
) -> list[Any]:
    """Records from rows whose JSON columns are parsed already (a row carries its `_bad` reason when
    one was not JSON). Validated as one batch (fast), row by row only when the batch fails."""
    bad = [r for r in rows if "_bad" in r]
    good = [r for r in rows if "_bad" not in r]
    for r in bad:
        problems.add(f"{label} row {r.get('_seq', '?')}", r["_bad"])
    seqs = [r.pop("_seq", "?") for r in good]
    if not good:
        return []
    if good[0].keys() != model.model_fields.keys():  # an older schema: model_construct fills the defaults
        return [model.model_construct(**row) for row in good]
    try:
        out: list[Any] = _list_adapter(model).validate_python(good)
    except ValidationError:
        out = []
        for seq, row in zip(seqs, good, strict=True):
            try:
                out.append(model.model_validate(row))
            except ValidationError as exc:
                problems.add(f"{label} row {seq}", _first_error(exc))
        return _checked(out, seqs, label, problems)
    return _checked(out, seqs, label, problems)


def _checked(out: list[Any], seqs: list[Any], label: str, problems: ReadProblems) -> list[Any]:
    out = _finite(out, seqs, label, problems)
    if out and hasattr(out[0], "data") and hasattr(out[0], "kind"):
        for seq, ev in zip(seqs, out, strict=False):
            for key in misfits(ev.kind, ev.data):
                problems.add(f"{label} row {seq}", f"data.{key} is {_short(ev.data.pop(key))}: left out")
    return out


def _finite(out: list[Any], seqs: list[Any], label: str, problems: ReadProblems) -> list[Any]:
    """A sample whose value is not a finite number (infinity stored by hand) is no reading."""
    if not out or not hasattr(out[0], "value"):
        return out
    keep = []
    for seq, rec in zip(seqs, out, strict=False):
        if math.isfinite(rec.value):
            keep.append(rec)
        else:
            problems.add(f"{label} row {seq}", f"value is {rec.value!r}, not a finite number")
    return keep


# A run's own row: a broken field with an empty value is read as that value, so the run's requests,
# samples and events still render; a field without one (the kind, say) makes the run unreadable.
_EMPTY: dict[str, Any] = {
    "name": "(name unreadable)",
    "plan": {},
    "plan_hash": "",
    "fixed": {},
    "target": {},
    "change": {},
    "started_at": 0.0,
    "ended_at": None,
    "status": "failed",
    "stop_reason": None,
    "notes": [],
}


def run_record(row: dict[str, Any], problems: ReadProblems) -> RunRecord | None:
    """A run from its stored row, the broken fields emptied and named; None if it cannot be read."""
    row = dict(row)
    row.pop("_seq", None)
    row.pop("_bad", None)
    label = f"run {row.get('run_id')}"
    for name, why in row.pop("_bad_columns", {}).items():  # every JSON column here has an empty value
        problems.add(label, f"{why}; read as empty")
        row[name] = _EMPTY[name]
    for _ in range(len(_EMPTY) + 1):
        try:
            return RunRecord.model_validate(row)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            name = str(err.get("loc", ("?",))[0])
            if name not in _EMPTY or row.get(name) == _EMPTY[name]:
                problems.add(label, f"cannot be read: {_first_error(exc)}")
                return None
            problems.add(label, f"{_first_error(exc)}; read as {_EMPTY[name]!r}")
            row[name] = _EMPTY[name]
    return None
