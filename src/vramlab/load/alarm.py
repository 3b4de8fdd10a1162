"""Wake-ups to the microsecond for the open loop's schedule: one Linux ``timerfd`` per window.

An event loop's own timers are coarse: uvloop (libuv) keeps them in whole milliseconds and
asyncio's selector rounds its poll timeout up to the next millisecond (``epoll_wait`` takes
milliseconds), so ``await asyncio.sleep(d)`` wakes up to about a millisecond late. Every request
of an open loop is timed from its *scheduled* send, so that lateness was the client's P99 overhead
(benchmarks/loadgen.py: 1.2 ms of dispatch lag against a bare process's 0.14 ms wake-up).

A ``timerfd`` armed at an absolute ``CLOCK_MONOTONIC`` time (the clock behind ``time.perf_counter``
on Linux) becomes readable when the kernel's high-resolution timer expires, and a readable file
descriptor ends ``epoll_wait`` at once, whatever its timeout; so a reader on it wakes the loop when
the next send is due, not at the next millisecond. One descriptor serves every sleeper of a window:
it is armed for the earliest deadline of a heap. Where there is no ``timerfd`` (not Linux, a libc
without it) ``Alarm.open`` returns None and the caller sleeps with the loop's own timer.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import os
import sys
import time

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1
EARLY_S = 20e-6  # a deadline this close when the timer fires is due now: no second wake-up for it


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or time.get_clock_info("perf_counter").implementation != (
        "clock_gettime(CLOCK_MONOTONIC)"
    ):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes, libc.timerfd_create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.timerfd_settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        ]
        libc.timerfd_settime.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class Alarm:
    """Sleep until a ``time.perf_counter`` time on one ``timerfd`` read by the running loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self.loop, self.fd = loop, fd
        self.heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self.seq = itertools.count()
        self.armed_at = float("inf")
        self.spec = _Itimerspec()
        loop.add_reader(fd, self._fire)

    @classmethod
    def open(cls) -> Alarm | None:
        """An alarm on the running loop, or None where the system has no ``timerfd``."""
        if _LIBC is None:
            return None
        fd = _LIBC.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            return None
        try:
            return cls(asyncio.get_running_loop(), fd)
        except (NotImplementedError, OSError, ValueError):  # a loop that cannot watch a descriptor
            os.close(fd)
            return None

    async def until(self, t: float) -> None:
        """Return at ``t`` (perf_counter seconds), a few microseconds late at most on an idle core."""
        fut: asyncio.Future[None] = self.loop.create_future()
        heapq.heappush(self.heap, (t, next(self.seq), fut))
        if t < self.armed_at:
            self._arm(t)
        await fut  # a cancelled sleeper's entry stays on the heap and is skipped when due

    def _arm(self, t: float) -> None:
        assert _LIBC is not None
        sec = int(t)
        self.spec.it_value.tv_sec, self.spec.it_value.tv_nsec = sec, max(1, int((t - sec) * 1e9))
        if _LIBC.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(self.spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        self.armed_at = t

    def _fire(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:  # re-armed after it expired: nothing to read yet
            pass
        heap, now = self.heap, time.perf_counter() + EARLY_S
        while heap and heap[0][0] <= now:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)
        self.armed_at = float("inf")
        if heap:
            self._arm(heap[0][0])

    def close(self) -> None:
        """Stop watching the descriptor and close it; sleepers still waiting are cancelled."""
        for _, _, fut in self.heap:
            fut.cancel()
        self.heap.clear()
        self.loop.remove_reader(self.fd)
        os.close(self.fd)
