"""One interface for every sampler (GPU, the sim's ledger, engine /metrics, Prometheus, host,
health) and the loop that runs them side by side at a fixed interval.

A sampler may also see timeline events (Ollama's model loads and unloads): ``take_events()`` hands
them over after each sample, to the ``on_event`` the set was given.

A sampler that cannot start raises ``SourceUnavailable`` from ``open()``: the run gets one line in
its notes and goes on without it. A sampler that fails later is noted once, and keeps being tried;
what a sampler finds worth saying while it works (an answer read in part) it hands over with
``take_notes()``. Every note names the sampler: a poller's trouble is the poller's, not the load's
or the store's.

A value that is not a finite number (NaN and ±Inf are legal Prometheus sample values) is no
reading the store can keep (SQLite stores NaN as NULL): it is left out, as a gap in that series,
and the sampler set says so once per series.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramlab.records.emit import Draft


@dataclass(frozen=True)
class Sample:
    source: str  # gpu | ledger | engine | prometheus | host | health | ollama
    name: str  # "gpu.memory_used_bytes", "engine.kv_cache_usage_perc", ...
    value: float
    t: float  # time.perf_counter() when it was read
    labels: dict[str, str] = field(default_factory=dict)


class SourceUnavailable(Exception):
    """The source is not there (no driver, no endpoint, no file); worded for the run's notes."""


class Sampler:
    """Subclasses set ``source`` and implement ``sample``; ``open``/``close`` are optional."""

    source: str = "?"

    async def open(self) -> None:
        return None

    async def sample(self) -> list[Sample]:
        raise NotImplementedError

    def take_events(self) -> list[Draft]:
        """Timeline events the sampler saw since the last call (typed drafts); most have none."""
        return []

    def take_notes(self) -> list[str]:
        """Lines for the run's notes since the last call, each naming the sampler; most have none."""
        return []

    async def close(self) -> None:
        return None


class FakeSampler(Sampler):
    """Plays back a script of values; ``unavailable`` makes ``open`` fail like a missing source."""

    def __init__(
        self, source: str, values: dict[str, Sequence[float]], unavailable: str | None = None
    ) -> None:
        self.source, self._values, self._unavailable = source, values, unavailable
        self.calls = 0
        self.closed = False

    async def open(self) -> None:
        if self._unavailable:
            raise SourceUnavailable(self._unavailable)

    async def sample(self) -> list[Sample]:
        i, self.calls = self.calls, self.calls + 1
        now = time.perf_counter()
        return [
            Sample(self.source, name, float(vs[min(i, len(vs) - 1)]), now)
            for name, vs in self._values.items()
        ]

    async def close(self) -> None:
        self.closed = True


class SamplerSet:
    """Runs samplers concurrently, each on its own tick, until ``stop()``."""

    def __init__(
        self,
        samplers: Sequence[Sampler],
        interval_s: float,
        on_samples: Callable[[list[Sample]], None],
        on_note: Callable[[str], None],
        on_event: Callable[[Draft], None] | None = None,
    ) -> None:
        self.samplers, self.interval_s = list(samplers), interval_s
        self._on_samples, self._on_note, self._on_event = on_samples, on_note, on_event
        self._tasks: list[asyncio.Task[None]] = []
        self.active: list[str] = []
        self._stopping = False
        self._not_finite: set[tuple[str, str]] = set()  # series already said to have read NaN or ±Inf

    async def start(self) -> None:
        for s in self.samplers:
            try:
                await asyncio.wait_for(s.open(), timeout=max(2.0, self.interval_s))
            except (SourceUnavailable, asyncio.TimeoutError, OSError) as exc:
                self._on_note(f"sampler {s.source}: not used: {exc or type(exc).__name__}")
                continue
            note = getattr(s, "open_note", None)  # what a sampler found out while opening (a discovered path)
            if note:
                self._on_note(note)
            self.active.append(s.source)
            self._tasks.append(asyncio.ensure_future(self._loop(s)))

    async def _loop(self, s: Sampler) -> None:
        noted = False
        next_t = time.perf_counter()
        # The flag, not only the cancel, ends the loop: asyncio.wait_for can swallow a cancellation
        # that lands as the sample completes (CPython gh-86296, fixed in 3.12), and a drill then
        # waited for this loop forever.
        while not self._stopping:
            try:
                samples = await _bounded(s.sample(), max(1.0, 2 * self.interval_s))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a flaky source must not end the run; it is noted once
                if not noted:
                    self._on_note(f"sampler {s.source}: failing: {type(exc).__name__}: {exc}"[:300])
                    noted = True
            else:
                if samples:
                    samples = self._finite(samples)
                if samples:
                    self._on_samples(samples)
                if self._on_event is not None:  # after the samples, so a timeline row follows its data
                    for draft in s.take_events():
                        self._on_event(draft)
            for note in s.take_notes():  # what it found while reading, failed or not
                self._on_note(note)
            next_t += self.interval_s
            await asyncio.sleep(max(0.0, next_t - time.perf_counter()))

    def _finite(self, samples: list[Sample]) -> list[Sample]:
        """The samples whose values are finite; each series that read NaN or ±Inf is noted once."""
        if all(math.isfinite(x.value) for x in samples):
            return samples
        for x in samples:
            if not math.isfinite(x.value) and (x.source, x.name) not in self._not_finite:
                self._not_finite.add((x.source, x.name))
                self._on_note(
                    f"sampler {x.source}: {x.name} read {x.value!r} (legal in Prometheus text); "
                    "values that are not finite numbers are not stored: a gap in that series"
                )
        return [x for x in samples if math.isfinite(x.value)]

    async def stop(self) -> None:
        self._stopping = True
        pending = set(self._tasks)
        for _ in range(3):  # a loop that lost its cancel ends on the flag by its next tick; cancel again
            if not pending:
                break
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=max(1.0, 2 * self.interval_s))
        self._tasks.clear()
        for s in self.samplers:
            try:
                await asyncio.wait_for(s.close(), timeout=2.0)
            except Exception:  # closing is best effort (and bounded); the data is already out
                pass


async def _bounded(awaitable: Any, timeout_s: float) -> Any:
    """*awaitable* with a time limit that never swallows a cancellation (asyncio.timeout, 3.11+)."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:  # Python 3.10
        return await asyncio.wait_for(awaitable, timeout=timeout_s)
    async with timeout(timeout_s):
        return await awaitable
