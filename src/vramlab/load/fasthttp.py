"""A lean streaming HTTP/1.1 client for plain ``http://`` targets: the load client's hot path.

aiohttp's ClientSession costs more CPU per request than everything else vramlab does for one
(issue #15: vramlab 0.75-0.79x a bare aiohttp loop, the rest of the gap being aiohttp's own request
path). This client does what a load generator needs and nothing else: non-blocking sockets it owns,
registered once with the running loop (``loop.add_reader``: asyncio and uvloop), a keep-alive pool
per target, the request's bytes built by the caller once per prompt, one ``send`` per request, and a
small strict response parser (status line, headers, Content-Length / chunked / close-delimited
bodies). ``https://``, proxies and credentials in the URL stay on aiohttp (client.py decides).

Arrival times come from the kernel: ``SO_TIMESTAMPNS`` makes every ``recvmsg`` carry the time the
kernel received the data (``SCM_TIMESTAMPNS``, CLOCK_REALTIME), so a busy client core that reads
late still reports when the bytes came. For TCP the stamp is that of the last segment the read
consumed (Linux ``tcp_recvmsg_locked`` keeps the last skb's stamp); bytes that reached the read
earlier have no stamp of their own. The sink is told whether a body piece ends at the read's last
byte (``exact``): only then is the stamp the arrival of that piece's end. The stamp is converted to
the ``time.perf_counter`` clock (CLOCK_MONOTONIC on Linux) by the offset between the two clocks,
sampled at every read, steps of the wall clock included (see Clock).
Where the option is missing (not Linux, or an unknown ABI) the stamp is ``perf_counter()`` at the
read, as aiohttp's path does.
"""

from __future__ import annotations

import asyncio
import collections
import platform
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

# SO_TIMESTAMPNS: in the socket module from Python 3.14 on; before that, the asm-generic value
# (include/uapi/asm-generic/socket.h: SO_TIMESTAMPNS_OLD 35, SO_TIMESTAMP_OLD 29, and
# SCM_* = SO_*), used by x86-64, arm64 and riscv64. Other ABIs (alpha, mips, parisc, sparc,
# powerpc) number them differently: they get read-time stamps.
_GENERIC_ABI = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64", "arm64", "riscv64")
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if _GENERIC_ABI else None)
_TS = struct.Struct("@qq")  # struct timespec on a 64-bit ABI: tv_sec, tv_nsec
_ANC = socket.CMSG_SPACE(_TS.size)
READ_SIZE = 1 << 16
MAX_HEAD = 64 << 10
MAX_ERROR_BODY = 64 << 10

# A sink gets the body of a 200 answer piece by piece: sink(data, stamp, exact) -> True when it has
# seen the end (the rest of the body is read and dropped, to keep the connection), raising nothing.
Sink = Callable[[bytes, float, bool], bool]


class FastHttpError(Exception):
    """A transport fault, with the error class the load client records (``connect``, ``stream_broken``,
    ``timeout``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = 0  # the answer's status when its head had come


class StopBody(Exception):
    """Raised by a sink that has seen enough (an error event, garbage): the answer ends now, with its
    status, and the connection is closed rather than read to its end."""


class _Retry(Exception):
    """A reused keep-alive connection turned out closed before a byte of the answer: send again."""


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
        self.steps: collections.deque[tuple[float, float]] = collections.deque(maxlen=4096)  # (seen at, new offset)
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


class _Conn:
    """One keep-alive connection; its reader is registered once, for its whole life."""

    __slots__ = ("sock", "fd", "pool", "resp", "reused", "stamps")

    def __init__(self, sock: socket.socket, pool: Pool, stamps: bool) -> None:
        self.sock, self.fd, self.pool = sock, sock.fileno(), pool
        self.resp: _Response | None = None
        self.reused = False
        self.stamps = stamps

    def on_readable(self) -> None:
        resp = self.resp
        if resp is None:  # idle: the server closed it (or sent something unasked): drop it
            try:
                self.sock.recv(1)
            except BlockingIOError:
                return
            except OSError:
                pass
            self.pool.drop(self)
            return
        pc = time.perf_counter
        while True:
            try:
                if self.stamps:
                    data, anc, _, _ = self.sock.recvmsg(READ_SIZE, _ANC)
                else:
                    data, anc = self.sock.recv(READ_SIZE), None
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                resp.fail_os(exc)
                return
            if anc:
                sec, nsec = _TS.unpack_from(anc[0][2])
                t = self.pool.clock.to_perf(sec, nsec)
            else:
                t = pc()
            resp.feed(data, t)
            if resp.fut.done() or len(data) < READ_SIZE:
                return


class _Response:
    """The parser of one answer: head, then a Content-Length, chunked or close-delimited body."""

    __slots__ = ("conn", "fut", "sink", "head", "status", "mode", "left", "chunk_state", "keep", "got_any",
                 "sink_done", "err_body", "pending")

    def __init__(self, conn: _Conn, fut: asyncio.Future[tuple[int, str | None]], sink: Sink) -> None:
        self.conn, self.fut, self.sink = conn, fut, sink
        self.head = b""
        self.status = 0
        self.mode = ""  # "" head | "length" | "chunked" | "close"
        self.left = 0  # length: body bytes to come; chunked: bytes of the current chunk's data to come
        self.chunk_state = 0  # chunked: 0 size line, 1 data, 2 CRLF after data, 3 trailers
        self.keep = True
        self.got_any = False
        self.sink_done = False
        self.err_body: bytearray | None = None
        self.pending = b""  # chunked: an incomplete size or trailer line

    # -- outcomes --------------------------------------------------------------------------------
    def _finish(self, reusable: bool) -> None:
        fut = self.fut
        if fut.done():
            return
        self.conn.resp = None
        self.conn.pool.release(self.conn, reusable and self.keep)
        if self.err_body is not None:
            fut.set_result((self.status, bytes(self.err_body).decode("utf-8", "replace")))
        else:
            fut.set_result((self.status, None))

    def _fail(self, exc: BaseException) -> None:
        if self.fut.done():
            return
        if isinstance(exc, FastHttpError):
            exc.status = self.status
        self.conn.resp = None
        self.conn.pool.drop(self.conn)
        self.fut.set_exception(exc)

    def fail_os(self, exc: OSError) -> None:
        if not self.got_any and self.conn.reused:
            self._fail(_Retry())
        elif self.status == 0:
            self._fail(FastHttpError("connect", f"{type(exc).__name__}: {exc.strerror or exc}"))
        else:
            self._fail(FastHttpError("stream_broken", f"{type(exc).__name__}: {exc.strerror or exc}"))

    def _eof(self) -> None:
        if self.mode == "close":
            self._finish(False)
        elif not self.got_any and self.conn.reused:
            self._fail(_Retry())
        elif self.status == 0:
            self._fail(FastHttpError("stream_broken", "ServerDisconnectedError: the server closed the connection "
                                                      "before its answer"))
        else:
            self._fail(FastHttpError("stream_broken", "ServerDisconnectedError: the server closed the connection "
                                                      "mid-answer"))

    def _malformed(self, why: str) -> None:
        self._fail(FastHttpError("stream_broken", f"malformed HTTP response: {why}"))

    # -- parsing ---------------------------------------------------------------------------------
    def feed(self, data: bytes, t: float) -> None:
        if not data:
            self._eof()
            return
        self.got_any = True
        if not self.mode:
            head = self.head + data if self.head else data
            i = head.find(b"\r\n\r\n")
            if i < 0:
                if len(head) > MAX_HEAD:
                    self._malformed(f"no end of headers in {MAX_HEAD >> 10} KiB")
                else:
                    self.head = head
                return
            self.head = b""
            if not self._parse_head(head[:i]):
                return
            data = head[i + 4:]
            if not self.mode:  # an interim answer (100 Continue): the real head follows
                if data:
                    self.feed(data, t)
                return
            if self.mode == "length" and self.left == 0:
                self._finish(not data)
                return
            if not data:
                return
        if self.mode == "chunked":
            self._chunked(data, t)
        elif self.mode == "length":
            n = len(data)
            if n > self.left:
                self._malformed("more body than its Content-Length")
                return
            self.left -= n
            self._body(data, t, True)
            if self.left == 0 and not self.fut.done():
                self._finish(True)
        else:
            self._body(data, t, True)

    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            self._malformed(f"bad status line {lines[0][:80]!r}")
            return False
        status = int(parts[1])
        if 100 <= status < 200:
            return True
        self.status = status
        self.keep = parts[0] == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                self._malformed(f"bad header line {line[:80]!r}")
                return False
            name = name.strip().lower()
            if name == b"content-length":
                v = value.strip()
                if not v.isdigit() or (length is not None and int(v) != length):
                    self._malformed(f"bad Content-Length {v[:40]!r}")
                    return False
                length = int(v)
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection":
                v = value.strip().lower()
                if b"close" in v:
                    self.keep = False
                elif b"keep-alive" in v:
                    self.keep = True
        if status in (204, 304):
            self.mode, self.left = "length", 0
        elif chunked:
            self.mode = "chunked"
        elif length is not None:
            self.mode, self.left = "length", length
        else:
            self.mode, self.keep = "close", False
        if status != 200:
            self.err_body = bytearray()
        return True

    def _body(self, data: bytes, t: float, exact: bool) -> None:
        if self.err_body is not None:
            if len(self.err_body) < MAX_ERROR_BODY:
                self.err_body += data[:MAX_ERROR_BODY - len(self.err_body)]
            return
        if self.sink_done:
            return
        try:
            done = self.sink(data, t, exact)
        except StopBody:
            self.keep = False
            self._finish(False)
            return
        except Exception as exc:  # a bug in the sink must not leave the request hanging
            self._fail(exc)
            return
        if done:
            self.sink_done = True

    def _chunked(self, data: bytes, t: float) -> None:
        """Decode chunked framing; the body bytes of this read go to the sink in one piece, ``exact``
        when nothing but their chunk's closing CRLF follows them in the read."""
        pos, n = 0, len(data)
        if self.chunk_state == 0 and not self.pending:
            # the usual read while streaming: exactly one whole chunk (a flushed SSE event)
            j = data.find(b"\r\n", 0, 18)
            if j > 0:
                try:
                    size = int(data[:j], 16)
                except ValueError:
                    size = -1  # an extension or garbage: the full decoder decides
                if size > 0 and n == j + size + 4 and data[-2:] == b"\r\n":
                    self._body(data[j + 2:n - 2], t, True)
                    return
        if self.pending:
            data, self.pending = self.pending + data, b""
            n = len(data)
        pieces: list[bytes] = []
        last_end = -1  # where the last body byte of this read ended
        while pos < n:
            st = self.chunk_state
            if st == 1:  # chunk data
                take = min(self.left, n - pos)
                pieces.append(data[pos:pos + take])
                pos += take
                last_end = pos
                self.left -= take
                if self.left == 0:
                    self.chunk_state = 2
            elif st == 2:  # the CRLF after the data
                if n - pos < 2:
                    if data[pos:] not in (b"\r",):
                        self._malformed("chunk data not followed by CRLF")
                        return
                    self.pending = data[pos:]
                    pos = n
                    break
                if data[pos:pos + 2] != b"\r\n":
                    self._malformed("chunk data not followed by CRLF")
                    return
                pos += 2
                self.chunk_state = 0
            else:  # 0: a size line; 3: trailer lines after the last chunk
                j = data.find(b"\r\n", pos)
                if j < 0:
                    if n - pos > 4096:
                        self._malformed("a chunk-size line longer than 4 KiB")
                        return
                    self.pending = data[pos:]
                    pos = n
                    break
                line = data[pos:j]
                pos = j + 2
                if st == 3:
                    if not line:  # the end of the body
                        if pieces:
                            self._body(b"".join(pieces) if len(pieces) > 1 else pieces[0], t, False)
                        self._finish(pos == n)
                        return
                    continue
                size_s = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_s, 16)
                except ValueError:
                    self._malformed(f"bad chunk size {line[:40]!r}")
                    return
                if size == 0:
                    self.chunk_state = 3
                else:
                    self.left, self.chunk_state = size, 1
        if pieces:
            rest = data[last_end:]
            exact = not rest or rest in (b"\r\n", b"\r")
            self._body(b"".join(pieces) if len(pieces) > 1 else pieces[0], t, exact)


class Pool:
    """Keep-alive connections to one ``host:port``, at most ``limit`` open at once."""

    def __init__(self, host: str, port: int, limit: int, connect_timeout_s: float = 60.0) -> None:
        self.host, self.port, self.limit = host, port, max(1, limit)
        self.loop = asyncio.get_running_loop()
        self.clock = Clock()
        self.idle: list[_Conn] = []
        self.all: set[_Conn] = set()
        self.opening = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.addr: tuple[Any, ...] | None = None
        self.family = socket.AF_INET
        self.closed = False
        self.stamps = SO_TIMESTAMPNS is not None
        self.connect_timeout_s = connect_timeout_s

    async def _resolve(self) -> None:
        try:
            infos = await self.loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise FastHttpError("connect", f"Cannot connect to host {self.host}:{self.port}: {exc}") from None
        self.family, _, _, _, self.addr = infos[0]

    async def _open(self) -> _Conn:
        if self.addr is None:
            await self._resolve()
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.stamps:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # type: ignore[arg-type]
                except OSError:
                    self.stamps = False  # refused here: read-time stamps from now on
            assert self.addr is not None
            await self.loop.sock_connect(sock, self.addr)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, OSError):
                raise FastHttpError("connect", f"Cannot connect to host {self.host}:{self.port}: "
                                               f"{exc.strerror or exc}") from None
            raise
        conn = _Conn(sock, self, self.stamps)
        self.all.add(conn)
        self.loop.add_reader(conn.fd, conn.on_readable)
        return conn

    async def get(self) -> _Conn:
        while True:
            if self.closed:
                raise FastHttpError("connect", "the client is closed")
            if self.idle:
                conn = self.idle.pop()
                conn.reused = True
                return conn
            if len(self.all) + self.opening < self.limit:
                self.opening += 1
                try:
                    return await self._open()
                finally:
                    self.opening -= 1
                    self._wake()
            fut = self.loop.create_future()
            self.waiters.append(fut)
            try:
                await fut
            except BaseException:
                if not fut.cancelled() and fut in self.waiters:
                    self.waiters.remove(fut)
                self._wake()  # pass on a wake-up this waiter got but cannot use
                raise

    def _wake(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and not self.closed:
            self.idle.append(conn)
            self._wake()
        else:
            self.drop(conn)

    def drop(self, conn: _Conn) -> None:
        if conn in self.all:
            self.all.discard(conn)
            try:
                self.loop.remove_reader(conn.fd)
            except (ValueError, OSError, RuntimeError):
                pass
            conn.sock.close()
        if conn in self.idle:
            self.idle.remove(conn)
        self._wake()

    def close(self) -> None:
        self.closed = True
        for conn in list(self.all):
            if conn.resp is not None:  # mid-answer: its request ends now, not at its timeout
                conn.resp._fail(FastHttpError("stream_broken", "the client was closed mid-answer"))
            self.drop(conn)
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def request(self, data: bytes, sink: Sink, deadline: float) -> tuple[int, str | None]:
        """Send ``data`` (a whole request) and read the answer before ``deadline`` (perf_counter).
        Returns (status, None) for a 200 streamed into ``sink``, (status, body text) for any other
        status. Raises FastHttpError; cancellation closes the connection in use."""
        loop = self.loop
        for _ in range(3):  # a reused connection the server had closed: try again on another
            left = deadline - time.perf_counter()
            if left <= 0:
                raise FastHttpError("timeout", "")
            if self.idle and not self.closed:
                conn = self.get_nowait()
            else:
                try:
                    conn = await asyncio.wait_for(self.get(), left)
                except asyncio.TimeoutError:
                    raise FastHttpError("timeout", "") from None
            fut: asyncio.Future[tuple[int, str | None]] = loop.create_future()
            resp = _Response(conn, fut, sink)
            conn.resp = resp
            timer = None
            try:
                try:
                    sent = conn.sock.send(data)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError as exc:
                    resp.fail_os(exc)
                    sent = len(data)
                if sent < len(data):
                    try:
                        await asyncio.wait_for(loop.sock_sendall(conn.sock, data[sent:]), deadline - time.perf_counter())
                    except asyncio.TimeoutError:
                        resp._fail(FastHttpError("timeout", ""))
                    except OSError as exc:
                        resp.fail_os(exc)
                if not fut.done():
                    timer = loop.call_at(loop.time() + (deadline - time.perf_counter()), resp._fail,
                                         FastHttpError("timeout", ""))
                return await fut
            except _Retry:
                continue
            except BaseException:
                if conn.resp is resp:  # cancelled mid-answer (or a bug): the connection's state is unknown
                    conn.resp = None
                    self.drop(conn)
                if not fut.done():
                    fut.cancel()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
        raise FastHttpError("stream_broken", "ServerDisconnectedError: the server closed the connection "
                                             "before its answer, three times")

    def get_nowait(self) -> _Conn:
        conn = self.idle.pop()
        conn.reused = True
        return conn


__all__ = ["SO_TIMESTAMPNS", "Clock", "FastHttpError", "Pool", "Sink", "StopBody"]
