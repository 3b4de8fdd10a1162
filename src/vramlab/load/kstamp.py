"""Kernel receive stamps for the lean HTTP client (fasthttp.py), on the ``time.perf_counter`` clock.

``SO_TIMESTAMPNS`` makes every ``recvmsg`` carry the time the kernel received the data
(``SCM_TIMESTAMPNS``, CLOCK_REALTIME), so a busy client core that reads late still reports when the
bytes came. For TCP the stamp is that of the last segment the read consumed (Linux
``tcp_recvmsg_locked`` keeps the last skb's stamp); bytes that reached the read earlier have no stamp
of their own. The stamp is converted to the ``time.perf_counter`` clock (CLOCK_MONOTONIC on Linux) by
the offset between the two clocks, sampled at every read, steps of the wall clock included (see Clock).
Where the option is missing (not Linux, or an unknown ABI) the client stamps a read with
``perf_counter()`` at the read, as aiohttp's path does.
"""

from __future__ import annotations

import collections
import platform
import socket
import struct
import sys
import time

# SO_TIMESTAMPNS: in the socket module from Python 3.14 on; before that, the asm-generic value
# (include/uapi/asm-generic/socket.h: SO_TIMESTAMPNS_OLD 35, SO_TIMESTAMP_OLD 29, and
# SCM_* = SO_*), used by x86-64, arm64 and riscv64. Other ABIs (alpha, mips, parisc, sparc,
# powerpc) number them differently: they get read-time stamps.
_GENERIC_ABI = sys.platform.startswith("linux") and platform.machine() in (
    "x86_64",
    "aarch64",
    "arm64",
    "riscv64",
)
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if _GENERIC_ABI else None)
TIMESPEC = struct.Struct("@qq")  # struct timespec on a 64-bit ABI: tv_sec, tv_nsec
ANC_SPACE = socket.CMSG_SPACE(TIMESPEC.size)  # recvmsg's ancillary buffer for one stamp


class Clock:
    """CLOCK_REALTIME (the kernel's receive stamps) to ``time.perf_counter`` seconds (CLOCK_MONOTONIC).

    The offset between the two clocks is not a constant everywhere: a step of the wall clock
    (clock_settime, an NTP or hypervisor time sync) moves it at once, and NTP slewing does not
    (it slews both). On the VM this was built on, a time-sync agent stepped the wall clock by
    ~1.5 ms about three times a second (5 ms/s against CLOCK_MONOTONIC, and CLOCK_MONOTONIC ran
    with CLOCK_MONOTONIC_RAW). So the offset is sampled at every read (two clock reads bracketing
    one wall-clock read; a bracket wider than 20 us, the thread preempted in between, is not
    trusted), a change of more than 20 us is a step, remembered with the monotonic time it was
    seen, and a stamp that converts to before the last step is converted with the offset that held
    before it (data that arrived before the step and was read after it)."""

    TRUST_S = 20e-6

    def __init__(self) -> None:
        self.offset = 0.0
        self.before = 0.0  # the offset before the last step
        self.step_at = float("-inf")  # perf_counter time the last step was seen
        self.steps: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=4096
        )  # (seen at, new offset)
        self.sample()
        self.before = self.offset
        self.steps.append((float("-inf"), self.offset))

    def sample(self) -> None:
        best = None
        for _ in range(5):  # the tightest bracket of the two reads wins
            a = time.perf_counter()
            r = time.time_ns()
            b = time.perf_counter()
            if best is None or b - a < best[0]:
                best = (b - a, r * 1e-9 - (a + b) / 2)
        assert best is not None
        self.offset = best[1]

    def to_perf(self, sec: int, nsec: int) -> float:
        """A kernel stamp (CLOCK_REALTIME sec, nsec) on the perf_counter clock; never later than now."""
        a = time.perf_counter()
        w = time.time()
        b = time.perf_counter()
        if b - a < self.TRUST_S:
            off = w - (a + b) / 2
            if abs(off - self.offset) > self.TRUST_S:  # the wall clock was stepped since the last read
                self.before, self.offset, self.step_at = self.offset, off, a
                self.steps.append((a, off))
        stamp = sec + nsec * 1e-9
        t = stamp - self.offset
        if t < self.step_at:
            t = stamp - self.before  # it arrived before the step
        if t > b or t < b - 60.0:  # impossible (a second step in between, or a bad stamp): the read's time
            return b
        return t


__all__ = ["ANC_SPACE", "SO_TIMESTAMPNS", "TIMESPEC", "Clock"]
