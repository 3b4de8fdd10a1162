"""The store writer: subscribes to the runner's events and writes them in batches as they come.

Batches go out every ``flush_s`` seconds (or ``batch`` rows), so a crash loses at most the last
second; phase ends and the run's end flush at once. Notes are kept on the run row as they arrive.
"""

from __future__ import annotations

import time
from typing import Any

from vramlab.experiment.events import DATA_KINDS, Event
from vramlab.experiment.records import EventRecord, RequestRecord, RunRecord, SampleRecord


class StoreRecorder:
    def __init__(self, store: Any, flush_s: float = 0.5, batch: int = 1000) -> None:
        self.store, self.flush_s, self.batch = store, flush_s, batch
        self.run_id: str | None = None
        self.notes: list[str] = []
        self._requests: list[RequestRecord] = []
        self._samples: list[SampleRecord] = []
        self._events: list[EventRecord] = []
        self._last = time.monotonic()
        self.written = {"requests": 0, "samples": 0, "events": 0}
        self.store_errors: list[str] = []  # writes that failed and were retried

    def __call__(self, ev: Event) -> None:
        if ev.kind == "run_start":
            run: RunRecord = ev.payload
            self.notes = list(run.notes)
            self.store.create_run(run)
            self.run_id = run.run_id
        if self.run_id is None:
            return
        if ev.kind == "request":
            self._requests.append(ev.payload)
        elif ev.kind == "samples":
            self._samples.extend(ev.payload)
        if ev.kind not in DATA_KINDS:
            self._events.append(EventRecord(run_id=self.run_id, t_s=ev.t_s, kind=ev.kind, round=ev.round,
                                            phase=ev.phase, step=ev.step, message=ev.message,
                                            data=_jsonable(ev.data)))
        if ev.kind in ("note", "warning") and ev.message:
            self.notes.append(ev.message)
            self.flush()
            try:
                self.store.update_run(self.run_id, notes=self.notes)
            except Exception as exc:  # the notes go out again with the run's end
                self.store_errors.append(f"{type(exc).__name__}: {exc}"[:300])
        elif ev.kind == "run_end":
            for attempt in range(5):  # the last write matters most: a busy store gets a few chances
                if self.flush():
                    break
                time.sleep(0.2 * (attempt + 1))
            if self.store_errors:
                self.notes.append(f"store: {len(self.store_errors)} writes failed and were retried; "
                                  f"first: {self.store_errors[0]}")
            d = ev.data
            self.store.update_run(self.run_id, status=d["status"], ended_at=d["ended_at"],
                                  stop_reason=d.get("stop_reason"), notes=self.notes)
        elif ev.kind in ("phase_end", "stop_condition", "run_start") or self._due():
            self.flush()

    def _due(self) -> bool:
        pending = len(self._requests) + len(self._samples) + len(self._events)
        return pending >= self.batch or (pending > 0 and time.monotonic() - self._last >= self.flush_s)

    def flush(self) -> bool:
        """Write what is pending; on a store error keep it for the next try (the run goes on)."""
        assert self.run_id is not None
        self._last = time.monotonic()
        try:
            if self._requests:
                self.written["requests"] += self.store.add_requests(self.run_id, self._requests)
                self._requests = []
            if self._samples:
                self.written["samples"] += self.store.add_samples(self.run_id, self._samples)
                self._samples = []
            if self._events:
                self.written["events"] += self.store.add_events(self.run_id, self._events)
                self._events = []
        except Exception as exc:  # a locked or briefly unreachable store must not lose the rows
            self.store_errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return False
        return True


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)):
            out[k] = [x if isinstance(x, (str, int, float, bool)) or x is None
                      else _jsonable(x) if isinstance(x, dict) else str(x) for x in v]
        elif isinstance(v, dict):
            out[k] = _jsonable(v)
        else:
            out[k] = str(v)
    return out
