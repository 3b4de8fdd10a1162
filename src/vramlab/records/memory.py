"""`MemoryStore`: the `Store` contract held in a process's memory.

For tests and for code that wants a store without a database. It keeps the SQL store's rules
(see `vramlab.records.store`), and hands out copies, so a caller changing a record it wrote or
read does not change what is stored, as with a database.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from vramlab.errors import NotFoundError, VramlabError
from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
from vramlab.records.store import ReadProblems

_HEX = re.compile(r"^[0-9a-f]+$")
_RUN_FIELDS = set(RunRecord.model_fields) - {"run_id"}
R = TypeVar("R", bound=BaseModel)


def _copy(rec: R) -> R:
    return rec.model_copy(deep=True)


class MemoryStore:
    """Runs and their rows in dicts and lists; thread-safe like the SQL store."""

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()
        self._runs: dict[str, RunRecord] = {}
        self._requests: dict[str, list[RequestRecord]] = {}
        self._samples: dict[str, list[SampleRecord]] = {}
        self._events: dict[str, list[EventRecord]] = {}
        self.read_problems = ReadProblems()  # records are validated on the way in: stays empty

    # -- writing -------------------------------------------------------------------------------

    def create_run(self, run: RunRecord) -> RunRecord:
        with self._lock:
            if run.run_id in self._runs:
                raise VramlabError(f"run {run.run_id} already exists in the store")
            self._runs[run.run_id] = RunRecord.model_validate(run.model_dump())
        return run

    def update_run(self, run_id: str, **fields: Any) -> RunRecord:
        unknown = set(fields) - _RUN_FIELDS
        if unknown:
            raise ValueError(f"update_run: unknown or read-only fields {sorted(unknown)}")
        with self._lock:
            current = self._get_exact(run_id)
            updated = RunRecord.model_validate({**current.model_dump(), **fields})
            self._runs[run_id] = updated
        return _copy(updated)

    def add_requests(self, run_id: str, records: Sequence[RequestRecord]) -> int:
        return self._add(self._requests, run_id, records)

    def add_samples(self, run_id: str, records: Sequence[SampleRecord]) -> int:
        return self._add(self._samples, run_id, records)

    def add_events(self, run_id: str, records: Sequence[EventRecord]) -> int:
        return self._add(self._events, run_id, records)

    def _add(self, table: dict[str, list[Any]], run_id: str, records: Sequence[BaseModel]) -> int:
        if not records:
            return 0
        for rec in records:
            if getattr(rec, "run_id", None) != run_id:
                raise ValueError(f"record for run {getattr(rec, 'run_id', None)} passed to run {run_id}")
        rows = [_copy(r) for r in records]
        with self._lock:
            self._get_exact(run_id)  # rows of an unknown run are refused, as the foreign key does
            table.setdefault(run_id, []).extend(rows)
        return len(rows)

    # -- reading -------------------------------------------------------------------------------

    def _get_exact(self, run_id: str) -> RunRecord:
        run = self._runs.get(run_id)
        if run is None:
            raise NotFoundError(f"no run {run_id!r} in {self.url} (see `vramlab runs`)")
        return run

    def get_run(self, id_or_prefix: str, *, exact: bool = False) -> RunRecord:
        key = id_or_prefix.strip().lower()
        if not key or not _HEX.match(key):
            raise NotFoundError(
                f"no run {id_or_prefix!r}: run ids are hex, like 7f3a91bc (see `vramlab runs`)"
            )
        with self._lock:
            if key in self._runs:
                return _copy(self._runs[key])
            hits = [] if exact else sorted(r for r in self._runs if r.startswith(key))
            if not hits:
                raise NotFoundError(f"no run {id_or_prefix!r} in {self.url} (see `vramlab runs`)")
            if len(hits) > 1:
                more = ", ..." if len(hits) > 5 else ""
                raise NotFoundError(
                    f"run id prefix {id_or_prefix!r} is ambiguous: {', '.join(hits[:5])}{more}; "
                    "give more characters"
                )
            return _copy(self._runs[hits[0]])

    def list_runs(self, limit: int = 50, kind: str | None = None) -> list[RunRecord]:
        with self._lock:
            runs = [r for r in self._runs.values() if kind is None or r.kind == kind]
        runs.sort(key=lambda r: r.run_id)
        runs.sort(key=lambda r: r.started_at, reverse=True)  # stable: newest first, then by id
        return [_copy(r) for r in (runs[:limit] if limit else runs)]

    def requests(self, run_id: str) -> list[RequestRecord]:
        with self._lock:
            return [_copy(r) for r in self._requests.get(run_id, [])]

    def samples(self, run_id: str, source: str | None = None) -> list[SampleRecord]:
        with self._lock:
            rows = [r for r in self._samples.get(run_id, []) if source is None or r.source == source]
        return [_copy(r) for r in sorted(rows, key=lambda r: r.t_s)]  # stable: insertion order on ties

    def events(self, run_id: str) -> list[EventRecord]:
        with self._lock:
            rows = list(self._events.get(run_id, []))
        return [_copy(r) for r in sorted(rows, key=lambda r: r.t_s)]

    def count(self, run_id: str) -> dict[str, int]:
        with self._lock:
            return {
                "requests": len(self._requests.get(run_id, [])),
                "samples": len(self._samples.get(run_id, [])),
                "events": len(self._events.get(run_id, [])),
            }

    def close(self) -> None:
        """Nothing to release; the data stays (a test may reopen and read it)."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["MemoryStore"]
