"""A lean streaming HTTP/1.1 client for plain ``http://`` targets: the load client's hot path.

aiohttp's ClientSession costs more CPU per request than everything else vramlab does for one
(measured in benchmarks/loadgen.py: vramlab 0.75-0.79x a bare aiohttp loop, the rest of the gap being aiohttp's own request
path). This client does what a load generator needs and nothing else: non-blocking sockets it owns,
registered once with the running loop (``loop.add_reader``: asyncio and uvloop), a keep-alive pool
per target, the request's bytes built by the caller once per prompt and one ``send`` per request.
The answer's framing is llhttp's, through ``httptools`` (h1response.py: status line, headers,
Content-Length / chunked / close-delimited bodies), with bounds on what llhttp leaves open (header
and trailer bytes, interim answers, error bodies). ``https://``, proxies and credentials in the URL
stay on aiohttp (client.py decides).

Arrival times come from the kernel: every read carries the time the kernel received its last
segment (``SO_TIMESTAMPNS``), converted to the ``time.perf_counter`` clock (kstamp.py); where the
option is missing the stamp is ``perf_counter()`` at the read, as aiohttp's path does.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import socket
import time
from typing import Any

from vramlab.load.h1response import FastHttpError, Response, Retry, Sink
from vramlab.load.kstamp import ANC_SPACE, SO_TIMESTAMPNS, TIMESPEC, Clock

READ_SIZE = 1 << 16


class Conn:
    """One keep-alive connection; its reader is registered once, for its whole life."""

    __slots__ = ("sock", "fd", "pool", "resp", "reused", "stamps", "framer")

    def __init__(self, sock: socket.socket, pool: Pool, stamps: bool) -> None:
        self.sock, self.fd, self.pool = sock, sock.fileno(), pool
        self.resp: Response | None = None  # the answer being read; None while idle
        self.framer = Response(self)  # this connection's parser, for each answer in turn
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
                    data, anc, _, _ = self.sock.recvmsg(READ_SIZE, ANC_SPACE)
                else:
                    data, anc = self.sock.recv(READ_SIZE), None
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                resp.fail_os(exc)
                return
            if anc:
                sec, nsec = TIMESPEC.unpack_from(anc[0][2])
                t = self.pool.clock.to_perf(sec, nsec)
            else:
                t = pc()
            resp.feed(data, t)
            if resp.fut.done() or len(data) < READ_SIZE:
                return


class Pool:
    """Keep-alive connections to one ``host:port``, at most ``limit`` open at once."""

    def __init__(self, host: str, port: int, limit: int, connect_timeout_s: float = 60.0) -> None:
        self.host, self.port, self.limit = host, port, max(1, limit)
        self.loop = asyncio.get_running_loop()
        self.clock = Clock()
        self.idle: list[Conn] = []
        self.all: set[Conn] = set()
        self.opening = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.addr: tuple[Any, ...] | None = None
        self.family = socket.AF_INET
        self.closed = False
        self.stamps = SO_TIMESTAMPNS is not None
        self.connect_timeout_s = connect_timeout_s
        # Every answer's deadline, earliest first, behind ONE loop timer armed at the earliest: a
        # loop timer per request (uvloop: a libuv handle made and closed each time) was a tenth of
        # the CPU one client core spends per request. Entries whose answer came are dropped when
        # they reach the top, or all at once when they outnumber the connections (``_watch``).
        self.deadlines: list[tuple[float, int, asyncio.Future[Any], Response]] = []
        self._seq = itertools.count()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    async def _resolve(self) -> list[tuple[Any, ...]]:
        try:
            infos = await self.loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise FastHttpError("connect", f"Cannot connect to host {self.host}:{self.port}: {exc}") from None
        return [(family, addr) for family, _, _, _, addr in infos]

    async def _open(self) -> Conn:
        """A new connection: to the address that answered before, else to each address the name
        resolves to in turn (``localhost`` may give ::1 first while the server listens on
        127.0.0.1 only, as aiohttp's connector also tries them all)."""
        candidates = [(self.family, self.addr)] if self.addr is not None else await self._resolve()
        last: FastHttpError | None = None
        for family, addr in candidates:
            try:
                sock = await self._connect(family, addr)
            except FastHttpError as exc:
                last = exc
                continue
            self.family, self.addr = family, addr
            conn = Conn(sock, self, self.stamps)
            self.all.add(conn)
            self.loop.add_reader(conn.fd, conn.on_readable)
            return conn
        if self.addr is not None:  # the address that answered before is gone: resolve again next time
            self.addr = None
        assert last is not None
        raise last

    async def _connect(self, family: Any, addr: tuple[Any, ...]) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.stamps:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # type: ignore[arg-type]
                except OSError:
                    self.stamps = False  # refused here: read-time stamps from now on
            await self.loop.sock_connect(sock, addr)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, OSError):
                raise FastHttpError(
                    "connect", f"Cannot connect to host {self.host}:{self.port}: {exc.strerror or exc}"
                ) from None
            raise
        return sock

    async def get(self) -> Conn:
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

    def release(self, conn: Conn, reusable: bool) -> None:
        if reusable and not self.closed:
            self.idle.append(conn)
            self._wake()
        else:
            self.drop(conn)

    def drop(self, conn: Conn) -> None:
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

    def _watch(self, deadline: float, fut: asyncio.Future[Any], resp: Response) -> None:
        """``resp`` fails with a timeout at ``deadline`` (perf_counter) unless ``fut`` is done by then."""
        heap = self.deadlines
        if len(heap) > 2 * self.limit + 64:  # mostly answered requests: keep the live ones only
            heap[:] = [e for e in heap if not e[2].done()]
            heapq.heapify(heap)
        heapq.heappush(heap, (deadline, next(self._seq), fut, resp))
        if self.timer is None or deadline < self.timer_at:
            self._arm(deadline)

    def _arm(self, deadline: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = deadline
        self.timer = self.loop.call_at(self.loop.time() + (deadline - time.perf_counter()), self._expire)

    def _expire(self) -> None:
        """The earliest deadline came: fail every answer past its own, wait for the next live one."""
        self.timer = None
        heap, now = self.deadlines, time.perf_counter()
        while heap:
            deadline, _, fut, resp = heap[0]
            if not fut.done():
                if deadline > now:
                    self._arm(deadline)
                    return
                resp.fail(FastHttpError("timeout", ""))
            heapq.heappop(heap)

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.deadlines.clear()
        for conn in list(self.all):
            if conn.resp is not None:  # mid-answer: its request ends now, not at its timeout
                conn.resp.fail(FastHttpError("stream_broken", "the client was closed mid-answer"))
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
            resp = conn.framer
            resp.start(fut, sink)
            conn.resp = resp
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
                        await asyncio.wait_for(
                            loop.sock_sendall(conn.sock, data[sent:]), deadline - time.perf_counter()
                        )
                    except asyncio.TimeoutError:
                        resp.fail(FastHttpError("timeout", ""))
                    except OSError as exc:
                        resp.fail_os(exc)
                if not fut.done():
                    self._watch(deadline, fut, resp)
                return await fut
            except Retry:
                continue
            except BaseException:
                if conn.resp is resp:  # cancelled mid-answer (or a bug): the connection's state is unknown
                    conn.resp = None
                    self.drop(conn)
                if not fut.done():
                    fut.cancel()
                raise
        raise FastHttpError(
            "stream_broken",
            "ServerDisconnectedError: the server closed the connection before its answer, three times",
        )

    def get_nowait(self) -> Conn:
        conn = self.idle.pop()
        conn.reused = True
        return conn


__all__ = ["Pool"]
