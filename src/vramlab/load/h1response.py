"""The response side of the lean HTTP/1.1 client (fasthttp.py): a small strict parser of one answer
(status line, headers, then a Content-Length, chunked or close-delimited body) and the errors it ends in.

A 200's body goes to a sink piece by piece, with the read's time; the sink is told whether a piece
ends at the read's last byte (``exact``): only then is that time the arrival of the piece's end (see
kstamp.py). Any other status's body is kept, up to MAX_ERROR_BODY, for the error message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlab.load.fasthttp import Conn

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


class Retry(Exception):
    """A reused keep-alive connection turned out closed before a byte of the answer: send again."""


class Response:
    """The parser of one answer: head, then a Content-Length, chunked or close-delimited body."""

    __slots__ = ("conn", "fut", "sink", "head", "status", "mode", "left", "chunk_state", "keep", "got_any",
                 "sink_done", "err_body", "pending")

    def __init__(self, conn: Conn, fut: asyncio.Future[tuple[int, str | None]], sink: Sink) -> None:
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

    def fail(self, exc: BaseException) -> None:
        if self.fut.done():
            return
        if isinstance(exc, FastHttpError):
            exc.status = self.status
        self.conn.resp = None
        self.conn.pool.drop(self.conn)
        self.fut.set_exception(exc)

    def fail_os(self, exc: OSError) -> None:
        if not self.got_any and self.conn.reused:
            self.fail(Retry())
        elif self.status == 0:
            self.fail(FastHttpError("connect", f"{type(exc).__name__}: {exc.strerror or exc}"))
        else:
            self.fail(FastHttpError("stream_broken", f"{type(exc).__name__}: {exc.strerror or exc}"))

    def _eof(self) -> None:
        if self.mode == "close":
            self._finish(False)
        elif not self.got_any and self.conn.reused:
            self.fail(Retry())
        elif self.status == 0:
            self.fail(FastHttpError("stream_broken", "ServerDisconnectedError: the server closed the connection "
                                                      "before its answer"))
        else:
            self.fail(FastHttpError("stream_broken", "ServerDisconnectedError: the server closed the connection "
                                                      "mid-answer"))

    def _malformed(self, why: str) -> None:
        self.fail(FastHttpError("stream_broken", f"malformed HTTP response: {why}"))

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
            self.fail(exc)
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


__all__ = ["MAX_ERROR_BODY", "MAX_HEAD", "FastHttpError", "Response", "Retry", "Sink", "StopBody"]
