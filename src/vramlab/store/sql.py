"""The run store on SQLAlchemy Core: one class, the same code for SQLite and PostgreSQL.

Every `add_*` call is one transaction, committed before it returns, so a crash (even SIGKILL)
loses only the batch being written. SQLite runs in WAL mode so a report can read while the
runner writes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from vramlab.errors import NotFoundError, VramlabError
from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
from vramlab.records.store import ReadProblems
from vramlab.redact import redact, redact_obj
from vramlab.store import schema
from vramlab.store.migrations import migrate
from vramlab.store.rows import decode_json, records, run_record
from vramlab.store.url import describe_url

_HEX = re.compile(r"^[0-9a-f]+$")
_RUN_FIELDS = set(RunRecord.model_fields) - {"run_id"}
# Free-text columns of each row table: the ones a server's words or a URL can reach.
_TEXT_FIELDS = {"requests": ("error",), "samples": ("name", "labels"), "events": ("message", "data")}


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a process crash loses nothing committed; only a power cut can drop the tail.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


@contextlib.contextmanager
def _sqlite_migration_lock(url: str) -> Iterator[None]:
    """Serialise schema set-up between processes opening the same SQLite file at once.

    pysqlite runs DDL outside transactions, so two processes could both see an empty file and
    both create tables. The lock is on a sidecar file, never the database: closing any descriptor
    of the database file would drop every POSIX lock this process holds on it, SQLite's included,
    and another process could then checkpoint and delete the WAL under a running writer (SQLite
    "How To Corrupt", section 2.2). PostgreSQL takes an advisory lock in `migrate` instead.
    """
    if not url.startswith("sqlite:///"):
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, as before
        yield
        return
    path = url[len("sqlite:///") :]
    try:
        fh = open(path + ".lock", "ab")
    except OSError as exc:
        if os.path.isfile(path) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            # A read-only folder: nobody can create tables there either; reading needs no lock.
            yield
            return
        raise VramlabError(
            f"cannot open the store at {path}: cannot create its lock file {path}.lock: {exc.strerror or exc}"
        ) from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def make_engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def _reason(exc: BaseException) -> str:
    """The driver's own first line, without SQLAlchemy's statement and parameters (a plan can be in them)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return redact(text.splitlines()[0] if text else type(exc).__name__)


@contextlib.contextmanager
def _writing(url: str) -> Iterator[None]:
    """A failed write as one line that names the store, never the SQL with the rows."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        raise StoreWriteError(f"cannot write to the store at {describe_url(url)}: {_reason(exc)}") from None


@contextlib.contextmanager
def _reading(url: str) -> Iterator[None]:
    try:
        yield
    except sa.exc.DBAPIError as exc:
        raise VramlabError(f"cannot read the store at {describe_url(url)}: {_reason(exc)}") from None


class StoreWriteError(VramlabError):
    """The store refused a write (full, read-only, locked too long, gone)."""


class StoreRowError(VramlabError):
    """A run's own stored row is corrupt past reading (exit 1: the store is there, the row is not whole)."""

    exit_code = 1


def _sqlite_file(url: str) -> str | None:
    """The absolute path of a SQLite store's file; None for any other store."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///") :].split("?", 1)[0]
    return os.path.abspath(path) if path and path != ":memory:" else None


class _FileGuard:
    """The promise that a SQLite store's rows are in the file at its path, kept under faults.

    SQLite writes through the descriptors it opened: a file removed or replaced under a running
    writer takes every later row into an inode nobody can read again (or into nothing), and a file
    made read-only or immutable mid-run fails writes only when SQLite next touches the main file
    (the WAL may take rows for a while). So before every write the path is checked: the same file
    (``st_dev``/``st_ino`` as at open), still there, still writable for this process (``access(2)``:
    the mode for a user, the immutable flag and a read-only mount for root too), and so are its
    ``-wal`` and ``-shm`` (SQLite maps the ``-shm``: growing one made immutable killed the process
    with SIGBUS). A failed check is a refused write, as a full disk is: the writer retries, then
    stops the run.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        st = os.stat(path)
        self.ident = (st.st_dev, st.st_ino)

    def problem(self) -> str | None:
        """Why the file at the path is no longer this store's writable file; None when it is."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "its file was removed while the run wrote to it"
        except OSError as exc:
            return f"its file cannot be checked: {exc.strerror or exc}"
        if (st.st_dev, st.st_ino) != self.ident:
            return "its file was replaced by another while the run wrote to it"
        if not os.access(self.path, os.W_OK):
            return "its file became read-only while the run wrote to it"
        for side in ("-wal", "-shm"):  # SQLite maps -shm: growing one made immutable is a SIGBUS
            if os.path.exists(self.path + side) and not os.access(self.path + side, os.W_OK):
                return f"its {side} file became read-only while the run wrote to it"
        return None

    def moved(self) -> bool:
        """The path no longer names the file this store opened (removed or replaced)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ident


def _count_file(path: str, run_id: str) -> dict[str, int]:
    """What the file now at *path* holds for a run, read as any later reader (`vramlab report`) reads
    it: the main file with the write-ahead log beside it, which SQLite applies (a copy of the store
    put back in its place reads with the old file's log: the rows are there, and are counted).
    Nothing when it is gone or not a store."""
    import sqlite3
    from urllib.parse import quote

    out = {t.name: 0 for t in schema.RUN_TABLES}
    if not os.path.isfile(path):
        return out
    try:
        con = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=2)
    except sqlite3.Error:
        return out
    try:
        for t in schema.RUN_TABLES:
            try:
                row = con.execute(f"SELECT count(*) FROM {t.name} WHERE run_id = ?", (run_id,)).fetchone()
            except sqlite3.Error:
                continue
            out[t.name] = int(row[0] or 0)
    finally:
        con.close()
    return out


def _columns(table: sa.Table) -> list[Any]:
    """The row's columns as read: JSON ones as their stored text (parsed per row by store.rows, so
    one that is not JSON costs its row, not the read), `seq` as `_seq` (to name a corrupt row)."""
    out: list[Any] = [table.c.seq.label("_seq")] if "seq" in table.c else []
    for c in table.c:
        if c.name == "seq" or c.name in schema.LIVENESS_COLUMNS:
            continue
        out.append(sa.cast(c, sa.Text).label(c.name) if isinstance(c.type, sa.JSON) else c)
    return out


def _json_names(table: sa.Table) -> tuple[str, ...]:
    return tuple(c.name for c in table.c if isinstance(c.type, sa.JSON))


class SqlStore:
    """Runs and their requests, samples and events, behind the `vramlab.records.store.Store` port.

    Use `vramlab.store.open_store` to get one.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        try:
            with _sqlite_migration_lock(url):
                migrate(self.engine)
        except sa.exc.DBAPIError as exc:  # not a database, unreadable, read-only, unreachable
            self.engine.dispose()
            raise VramlabError(f"cannot open the store at {describe_url(url)}: {_reason(exc)}") from None
        self.read_problems = ReadProblems()  # rows a read left out (vramlab.store.rows)
        path = _sqlite_file(url)
        self._guard = _FileGuard(path) if path is not None and os.path.isfile(path) else None

    def _check_file(self) -> None:
        """Before a write: the rows must land in the file at the store's path (see _FileGuard)."""
        if self._guard is not None:
            why = self._guard.problem()
            if why is not None:
                raise StoreWriteError(f"cannot write to the store at {describe_url(self.url)}: {why}")

    # -- writing -------------------------------------------------------------------------------

    def create_run(self, run: RunRecord) -> RunRecord:
        self._check_file()
        with _writing(self.url), self.engine.begin() as conn:
            exists = conn.execute(sa.select(schema.runs.c.run_id).where(schema.runs.c.run_id == run.run_id))
            if exists.first() is not None:
                raise VramlabError(f"run {run.run_id} already exists in the store")
            conn.execute(sa.insert(schema.runs).values(**redact_obj(run.model_dump())))
        return run

    def update_run(self, run_id: str, **fields: Any) -> RunRecord:
        """Change some fields of a run (status, ended_at, stop_reason, notes, ...); validated first."""
        unknown = set(fields) - _RUN_FIELDS
        if unknown:
            raise ValueError(f"update_run: unknown or read-only fields {sorted(unknown)}")
        self._check_file()  # before the read too: reading through an immutable -shm is a SIGBUS
        current = self.get_run(run_id, exact=True)
        updated = RunRecord.model_validate({**current.model_dump(), **fields})
        values = {k: redact_obj(getattr(updated, k)) for k in fields}
        self._check_file()
        with _writing(self.url), self.engine.begin() as conn:
            conn.execute(sa.update(schema.runs).where(schema.runs.c.run_id == run_id).values(**values))
        return updated

    def add_requests(self, run_id: str, records: Sequence[RequestRecord]) -> int:
        return self._add(schema.requests, run_id, records)

    def add_samples(self, run_id: str, records: Sequence[SampleRecord]) -> int:
        return self._add(schema.samples, run_id, records)

    def add_events(self, run_id: str, records: Sequence[EventRecord]) -> int:
        return self._add(schema.events, run_id, records)

    def _add(self, table: sa.Table, run_id: str, records: Sequence[Any]) -> int:
        if not records:
            return 0
        rows = []
        text_fields = _TEXT_FIELDS[table.name]
        for rec in records:
            if rec.run_id != run_id:
                raise ValueError(f"record for run {rec.run_id} passed to run {run_id}")
            row = rec.model_dump()
            for name in text_fields:  # nothing that leaves the process carries a secret (vramlab.redact)
                value = row.get(name)
                if value:
                    row[name] = redact(value) if isinstance(value, str) else redact_obj(value)
            rows.append(row)
        self._check_file()
        with _writing(self.url), self.engine.begin() as conn:
            conn.execute(sa.insert(table), rows)
        return len(rows)

    def heartbeat(self, run_id: str) -> None:
        """Stamp the run's writer as alive now (the store writer calls this every few seconds)."""
        import socket
        import time

        self._check_file()
        with _writing(self.url), self.engine.begin() as conn:
            conn.execute(
                sa.update(schema.runs)
                .where(schema.runs.c.run_id == run_id)
                .values(
                    heartbeat_at=time.time(), writer_pid=os.getpid(), writer_host=socket.gethostname()[:255]
                )
            )

    def liveness(self, run_ids: Sequence[str]) -> dict[str, tuple[float | None, int | None, str | None]]:
        """run_id -> (heartbeat_at, writer_pid, writer_host) for the given runs."""
        t = schema.runs
        if not run_ids:
            return {}
        q = sa.select(t.c.run_id, t.c.heartbeat_at, t.c.writer_pid, t.c.writer_host).where(
            t.c.run_id.in_(run_ids)
        )
        with _reading(self.url), self.engine.connect() as conn:
            return {r[0]: (r[1], r[2], r[3]) for r in conn.execute(q)}

    def count(self, run_id: str) -> dict[str, int]:
        """How many requests, samples and events the store holds for a run: for a SQLite file removed
        or replaced mid-run, what the file now at its path holds (the rows written into the old one
        cannot be read there again)."""
        if self._guard is not None and self._guard.moved():
            return _count_file(self._guard.path, run_id)
        why = self._guard.problem() if self._guard is not None else None
        if why is not None and ("-shm" in why or "-wal" in why):
            # the rows in the log cannot be read from here: "could not be read back", not a false count
            self._abandon_connections()
            raise VramlabError(f"cannot count what the store at {describe_url(self.url)} holds: {why}")
        out = {}
        with _reading(self.url), self.engine.connect() as conn:
            for t in schema.RUN_TABLES:
                out[t.name] = int(
                    conn.execute(
                        sa.select(sa.func.count()).select_from(t).where(t.c.run_id == run_id)
                    ).scalar()
                    or 0
                )
        return out

    # -- reading -------------------------------------------------------------------------------

    def get_run(self, id_or_prefix: str, *, exact: bool = False) -> RunRecord:
        """The run whose id is, or uniquely starts with, *id_or_prefix*."""
        key = id_or_prefix.strip().lower()
        if not key or not _HEX.match(key):
            raise NotFoundError(
                f"no run {id_or_prefix!r}: run ids are hex, like 7f3a91bc (see `vramlab runs`)"
            )
        col = schema.runs.c.run_id
        cond = col == key if exact else col.like(key + "%")
        with _reading(self.url), self.engine.connect() as conn:
            rows = [
                dict(r)
                for r in conn.execute(sa.select(*_columns(schema.runs)).where(cond).order_by(col).limit(6))
                .mappings()
                .all()
            ]
        if not rows:
            raise NotFoundError(f"no run {id_or_prefix!r} in {describe_url(self.url)} (see `vramlab runs`)")
        if len(rows) > 1:
            exact_hit = [r for r in rows if r["run_id"] == key]
            if exact_hit:
                return self._run(exact_hit[0])
            ids = ", ".join(r["run_id"] for r in rows[:5])
            more = ", ..." if len(rows) > 5 else ""
            raise NotFoundError(
                f"run id prefix {id_or_prefix!r} is ambiguous: {ids}{more}; give more characters"
            )
        return self._run(rows[0])

    def _run(self, row: dict[str, Any]) -> RunRecord:
        run = run_record(decode_json(row, _json_names(schema.runs)), self.read_problems)
        if run is None:
            raise StoreRowError(
                f"run {row.get('run_id')} cannot be read from {describe_url(self.url)}: "
                + self.read_problems.rows[-1].split(": ", 1)[-1]
            )
        return run

    def list_runs(self, limit: int = 50, kind: str | None = None) -> list[RunRecord]:
        """Runs, newest first."""
        q = sa.select(*_columns(schema.runs)).order_by(schema.runs.c.started_at.desc(), schema.runs.c.run_id)
        if kind is not None:
            q = q.where(schema.runs.c.kind == kind)
        if limit:
            q = q.limit(limit)
        names = _json_names(schema.runs)
        with _reading(self.url), self.engine.connect() as conn:
            rows = [decode_json(dict(r), names) for r in conn.execute(q).mappings()]
        return [run for run in (run_record(r, self.read_problems) for r in rows) if run is not None]

    def requests(self, run_id: str) -> list[RequestRecord]:
        return self._read(schema.requests, RequestRecord, run_id, order=[schema.requests.c.seq])

    def samples(self, run_id: str, source: str | None = None) -> list[SampleRecord]:
        t = schema.samples
        extra = [t.c.source == source] if source is not None else []
        return self._read(t, SampleRecord, run_id, order=[t.c.t_s, t.c.seq], where=extra)

    def events(self, run_id: str) -> list[EventRecord]:
        t = schema.events
        return self._read(t, EventRecord, run_id, order=[t.c.t_s, t.c.seq])

    def _read(
        self, table: sa.Table, model: Any, run_id: str, order: Iterable[Any], where: Iterable[Any] = ()
    ) -> list[Any]:
        q = sa.select(*_columns(table)).where(table.c.run_id == run_id, *where).order_by(*order)
        names = _json_names(table)
        with _reading(self.url), self.engine.connect() as conn:
            rows = [decode_json(dict(r), names) for r in conn.execute(q).mappings()]
        return records(model, rows, f"{table.name} of run {run_id}", self.read_problems)

    def _abandon_connections(self) -> None:
        """Never touch the file through this store's connections again. Its ``-shm`` is mapped into
        this process and can no longer be written (made immutable): any access, closing included
        (SQLite checkpoints as the last connection closes), faults with SIGBUS and kills the process
        before it can say what it kept. The pool is dropped without closing its connections and given
        one reference that is never released, so no finalizer closes them, at exit either; the
        ``-wal`` stays beside the file for the next reader to apply."""
        import ctypes

        pool = self.engine.pool
        self.engine.dispose(close=False)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(pool))

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
