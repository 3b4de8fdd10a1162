"""The `Store` port: what the runner, the recorder, the drill, analysis and the reports need from
a run store, and nothing more.

Two implementations: `vramlab.store.sql.SqlStore` (SQLite or PostgreSQL, `vramlab.store.open_store`)
and `vramlab.records.memory.MemoryStore` (in memory, for tests and dry runs). Code that receives a
store types it as `Store`, so it depends on this contract, not on SQLAlchemy.

Semantics every implementation keeps (tests/test_store.py runs the same tests on each):
- `create_run` refuses an id that exists (VramlabError); `update_run` validates the merged run and
  refuses unknown or read-only fields (ValueError) and unknown runs (NotFoundError).
- `add_*` write a whole batch or nothing; a record of another run is a ValueError. They return the
  number of rows written.
- `get_run` takes an id or a unique hex prefix (NotFoundError otherwise); `list_runs` is newest first.
- `requests` come back in insertion order, `samples` and `events` by time then insertion order.
- a stored row the contract refuses (a file edited by hand, a bug's leftovers) never fails a read:
  it is left out and named in `read_problems`; a run's own row is read with its broken fields
  emptied, or refused (`get_run`) / left out (`list_runs`) when it cannot be.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord

MAX_NAMED = 5  # rows named one by one in a summary; the rest are counted


class ReadProblems:
    """What could not be read, one entry per row or field, with a summary line."""

    def __init__(self) -> None:
        self.rows: list[str] = []

    def add(self, where: str, why: str) -> None:
        self.rows.append(f"{where}: {why}"[:240])

    def __bool__(self) -> bool:
        return bool(self.rows)

    def summary(self) -> str:
        named = "; ".join(self.rows[:MAX_NAMED])
        more = f"; and {len(self.rows) - MAX_NAMED} more" if len(self.rows) > MAX_NAMED else ""
        return (
            f"{len(self.rows)} stored row(s) or field(s) could not be read and were left out: {named}{more}"
        )


@runtime_checkable
class Store(Protocol):
    url: str
    read_problems: ReadProblems  # stored rows the reads so far left out (corrupt), named

    def create_run(self, run: RunRecord) -> RunRecord: ...

    def update_run(self, run_id: str, **fields: Any) -> RunRecord: ...

    def add_requests(self, run_id: str, records: Sequence[RequestRecord]) -> int: ...

    def add_samples(self, run_id: str, records: Sequence[SampleRecord]) -> int: ...

    def add_events(self, run_id: str, records: Sequence[EventRecord]) -> int: ...

    def get_run(self, id_or_prefix: str, *, exact: bool = False) -> RunRecord: ...

    def list_runs(self, limit: int = 50, kind: str | None = None) -> list[RunRecord]: ...

    def requests(self, run_id: str) -> list[RequestRecord]: ...

    def samples(self, run_id: str, source: str | None = None) -> list[SampleRecord]: ...

    def events(self, run_id: str) -> list[EventRecord]: ...

    def count(self, run_id: str) -> dict[str, int]:
        """Rows the store holds for a run, per table (requests, samples, events)."""
        ...

    def close(self) -> None: ...


__all__ = ["ReadProblems", "Store"]
