"""The store writer: subscribes to the runner's events and writes them in batches from its own
thread, so a slow or struggling store never holds up the event loop (and the latencies measured on it).

Batches go out every ``flush_s`` seconds (or ``batch`` rows), so a crash loses at most the last
second; phase ends and stop conditions flush at once. Notes are kept on the run row as they arrive.
The same thread stamps a heartbeat on the run row every ``heartbeat_s`` seconds, so `vramlab runs`
can tell a run that is still going from one whose process died.

A failed write is an event of the run: it is retried (``retries`` times, backing off), and when the
store still refuses, ``on_failure`` is called once with the reason (the session stops the load and
the rollbacks run); the rows not written are counted, never silently dropped: when the run ends
(or the writer closes) they go to a JSON-lines file beside the working folder (``spool()``:
``vramlab-unsaved-RUNID.jsonl``, else in the temporary folder), redacted like a store row, and
`accounting()` says exactly what was received, what the store holds and where the rest went.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
from vramlab.records.store import Store
from vramlab.run.events import DATA_KINDS, Event, EventKind

_KINDS = ("requests", "samples", "events")


@dataclass(frozen=True)
class Accounting:
    """What the run produced and what the store holds, per table."""

    received: dict[str, int]
    written: dict[str, int]
    failure: str | None  # the write error that stopped the run, if any
    spooled: tuple[str, int] | None = None  # (file, rows) the store refused, written there instead

    @property
    def complete(self) -> bool:
        return self.failure is None and all(self.written[k] >= self.received[k] for k in _KINDS)

    def missing(self) -> dict[str, int]:
        return {k: self.received[k] - self.written[k] for k in _KINDS if self.received[k] > self.written[k]}

    def line(self) -> str:
        parts = [f"{self.written[k]} of {self.received[k]} {k}" for k in _KINDS]
        return "stored " + ", ".join(parts) + self.spool_line()

    def spool_line(self) -> str:
        if self.spooled is None:
            return ""
        return f"; the {self.spooled[1]} rows the store refused are in {self.spooled[0]} (JSON lines)"


class StoreRecorder:
    def __init__(
        self,
        store: Store,
        flush_s: float = 0.5,
        batch: int = 1000,
        *,
        retries: int = 4,
        retry_base_s: float = 0.2,
        heartbeat_s: float = 2.0,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.store, self.flush_s, self.batch = store, flush_s, batch
        self.retries, self.retry_base_s, self.heartbeat_s = retries, retry_base_s, heartbeat_s
        self.on_failure = on_failure
        self.run_id: str | None = None
        self.notes: list[str] = []
        self._requests: list[RequestRecord] = []
        self._samples: list[SampleRecord] = []
        self._events: list[EventRecord] = []
        self._notes_dirty = False
        self._lock = threading.Lock()  # guards the pending lists and the counters
        self._write_lock = threading.Lock()  # one writer at a time (the thread, or a final flush)
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._last_beat = 0.0
        self.received = {k: 0 for k in _KINDS}
        self.written = {k: 0 for k in _KINDS}
        self.spooled: tuple[str, int] | None = None
        self.store_errors: list[str] = []  # writes that failed (each retry counts)
        self.failure: str | None = None  # set once the retries ran out

    # -- the event side (the event loop's thread: appends only, never waits on the store) ---------
    def __call__(self, ev: Event) -> None:
        if ev.kind == EventKind.REQUEST and self.run_id is not None:
            # The hot path: thousands a second. list.append is atomic, and the writer only ever
            # removes a prefix it copied, so no lock is needed; only this thread counts `received`.
            requests, rec = self._requests, ev.payload
            assert isinstance(rec, RequestRecord), "a request event carries its RequestRecord"
            requests.append(rec)
            self.received["requests"] += 1
            if len(requests) >= self.batch and not self._wake.is_set():
                self._idle.clear()
                self._wake.set()
            return
        if ev.kind == EventKind.RUN_START:
            run = ev.payload
            assert isinstance(run, RunRecord), "run_start carries the RunRecord"
            self.notes = list(run.notes)
            self.store.create_run(run)  # before any load: a store that refuses the run stops it here
            self.run_id = run.run_id
            self._beat()
            self._start_thread()
        if self.run_id is None:
            return
        with self._lock:
            if ev.kind == EventKind.REQUEST and isinstance(ev.payload, RequestRecord):
                self._requests.append(ev.payload)
                self.received["requests"] += 1
            elif ev.kind == EventKind.SAMPLES and isinstance(ev.payload, list):
                self._samples.extend(ev.payload)
                self.received["samples"] += len(ev.payload)
            if ev.kind not in DATA_KINDS:
                self._events.append(
                    EventRecord(
                        run_id=self.run_id,
                        t_s=ev.t_s,
                        kind=ev.kind,
                        round=ev.round,
                        phase=ev.phase,
                        step=ev.step,
                        message=ev.message,
                        data=_jsonable(ev.data),
                    )
                )
                self.received["events"] += 1
            if ev.kind in (EventKind.NOTE, EventKind.WARNING) and ev.message:
                self.notes.append(ev.message)
                self._notes_dirty = True
            pending = len(self._requests) + len(self._samples) + len(self._events)
        if ev.kind == EventKind.RUN_END:
            self._finish(ev)
        elif (
            ev.kind in (EventKind.PHASE_END, EventKind.STOP_CONDITION, EventKind.NOTE, EventKind.WARNING)
            or pending >= self.batch
        ):
            self._idle.clear()
            self._wake.set()

    # -- the writer thread ------------------------------------------------------------------------
    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name=f"vramlab-store-{self.run_id}", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        last_flush = time.monotonic()
        while not self._closing:
            now = time.monotonic()
            timeout = max(0.0, min(last_flush + self.flush_s, self._last_beat + self.heartbeat_s) - now)
            woken = self._wake.wait(timeout)
            self._wake.clear()
            if self._closing:
                break
            if self.failure is None and (woken or time.monotonic() - last_flush >= self.flush_s):
                last_flush = time.monotonic()
                self.flush()
            if time.monotonic() - self._last_beat >= self.heartbeat_s:
                self._beat()
            with self._lock:
                if not (self._requests or self._samples or self._events or self._notes_dirty) or self.failure:
                    self._idle.set()

    def _beat(self) -> None:
        self._last_beat = time.monotonic()
        beat = getattr(self.store, "heartbeat", None)
        if beat is None or self.run_id is None:
            return
        try:
            beat(self.run_id)
        except Exception as exc:
            self._error(exc)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until what is pending now has been written (or the writer gave up). For tests and the end."""
        self._idle.clear()
        self._wake.set()
        return self._idle.wait(timeout)

    # -- writing ----------------------------------------------------------------------------------
    def flush(self) -> bool:
        """Write what is pending, retrying a failed write; True when nothing is left pending.

        After the last retry the rows stay pending (a later flush tries again), `failure` is set
        and ``on_failure`` is called once."""
        assert self.run_id is not None
        with self._write_lock:
            for attempt in range(self.retries + 1):
                try:
                    self._write_once()
                    return True
                except Exception as exc:
                    self._error(exc)
                    if attempt < self.retries:
                        time.sleep(self.retry_base_s * (2**attempt))
            self._fail(self.store_errors[-1])
            return False

    def _write_once(self) -> None:
        run_id = self.run_id
        assert run_id is not None
        for kind, add in (
            ("requests", self.store.add_requests),
            ("samples", self.store.add_samples),
            ("events", self.store.add_events),
        ):
            while True:
                # At most `batch` rows a transaction: a store that refuses fails fast on the first
                # chunk, and what went in before is counted exactly.
                with self._lock:
                    batch = list(getattr(self, "_" + kind)[: self.batch])
                if not batch:
                    break
                n = add(run_id, batch)  # one transaction: all of the chunk or none of it
                with self._lock:
                    del getattr(self, "_" + kind)[: len(batch)]
                    self.written[kind] += n
        with self._lock:
            dirty, notes = self._notes_dirty, list(self.notes)
            self._notes_dirty = False
        if dirty:
            try:
                self.store.update_run(run_id, notes=notes)
            except Exception:
                with self._lock:
                    self._notes_dirty = True
                raise

    def _error(self, exc: BaseException) -> None:
        from vramlab.redact import redact

        orig = getattr(
            exc, "orig", None
        )  # SQLAlchemy wraps the driver's error; the driver's words are the news
        err = orig if isinstance(orig, BaseException) else exc
        self.store_errors.append(redact(" ".join(f"{type(err).__name__}: {err}".split()))[:300])

    def _fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = f"the store refused writes {self.retries + 1} times: {reason}"
        if self.on_failure is not None:
            try:
                self.on_failure(self.failure)
            except Exception as exc:
                self._error(exc)

    def _finish(self, ev: Event) -> None:
        """run_end: stop the thread, write everything left (a few more chances), then the run row."""
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        assert self.run_id is not None
        with self._lock:
            pending = bool(self._requests or self._samples or self._events or self._notes_dirty)
        if pending:
            self.flush()
        if self.failure is not None:
            self.spool()  # what the store refused goes to a file, said in the notes and the result
        acct = self.accounting()
        d = ev.data
        status, reason = d["status"], d.get("stop_reason")
        if not acct.complete:
            # No run is reported as completed with fewer rows than it counted.
            status = "failed"
            reason = f"store write failed: {acct.line()}" + (f" ({self.failure})" if self.failure else "")
        if self.store_errors:
            self.notes.append(
                f"store: {len(self.store_errors)} writes failed"
                + (" and were retried" if acct.complete else "")
                + f"; first: {self.store_errors[0]}"
            )
        if not acct.complete:
            self.notes.append(f"store: {acct.line()}; missing {acct.missing()}")
        try:
            self.store.update_run(
                self.run_id, status=status, ended_at=d["ended_at"], stop_reason=reason, notes=self.notes
            )
        except Exception as exc:
            self._error(exc)
            if self.failure is None:
                self._fail(self.store_errors[-1])

    def accounting(self) -> Accounting:
        with self._lock:
            return Accounting(dict(self.received), dict(self.written), self.failure, self.spooled)

    def close(self) -> None:
        """Stop the writer thread without a run_end (the run never ended normally)."""
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.failure is not None:
            self.spool()

    def spool(self) -> tuple[str, int] | None:
        """Write the rows the store refused to a JSON-lines file (the run's row first, then one line
        per row: {"table": ..., "row": ...}), redacted as the store would; (the file, rows) or None."""
        import json
        import os
        import tempfile

        from vramlab.redact import redact_obj

        with self._lock:
            rows = [(k, r) for k in _KINDS for r in getattr(self, "_" + k)]
            if not rows or self.spooled is not None or self.run_id is None:
                return self.spooled
            for k in _KINDS:
                getattr(self, "_" + k).clear()
        name = f"vramlab-unsaved-{self.run_id}.jsonl"
        for folder in (os.getcwd(), tempfile.gettempdir()):
            path = os.path.join(folder, name)
            try:
                with open(path, "x", encoding="utf-8") as fh:
                    fh.write(json.dumps({"run_id": self.run_id, "notes": self.notes}) + "\n")
                    for table, rec in rows:
                        row = redact_obj(rec.model_dump(mode="json"))
                        fh.write(json.dumps({"table": table, "row": row}) + "\n")
            except OSError:
                continue
            self.spooled = (path, len(rows))
            return self.spooled
        return None


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)):
            out[k] = [
                x
                if isinstance(x, (str, int, float, bool)) or x is None
                else _jsonable(x)
                if isinstance(x, dict)
                else str(x)
                for x in v
            ]
        elif isinstance(v, dict):
            out[k] = _jsonable(v)
        else:
            out[k] = str(v)
    return out
