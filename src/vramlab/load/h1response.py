"""The response side of the lean HTTP/1.1 client (fasthttp.py): one answer's framing, read by
``httptools`` (llhttp, the parser behind uvicorn), and the errors it ends in.

llhttp decides the framing: status line, headers, Content-Length, chunked (sizes, extensions,
trailers) and keep-alive, strictly: a negative, overflowing or non-hex chunk size, a bad status line
or header, bytes after the answer's end and a protocol switch are errors. What llhttp leaves to its
caller is bounded here, so no server can hang or grow the client:

- **framing without body**: at most MAX_FRAMING bytes of headers, interim answers, chunk-size lines
  or trailers between two pieces of body (llhttp itself has no header size limit);
- **interim answers** (``100 Continue``, ``103 Early Hints``): at most MAX_INTERIM before the real one;
- **an error body** (any status but 200) is kept up to MAX_ERROR_BODY for the message; then the
  answer ends there (the connection is closed, not drained);
- **body after the end of the stream** (``data: [DONE]`` seen, and the server still sends body):
  the answer ends there with what it had, the connection closed;
- a never-ending or silent answer ends at the request's deadline (fasthttp.py's timer).

A 200's body goes to a sink piece by piece, with the read's time; the sink is told whether a piece
ends at the read's last byte (``exact``): only then is that time the arrival of the piece's end (see
kstamp.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from httptools import HttpParserCallbackError, HttpParserError, HttpParserUpgrade, HttpResponseParser

if TYPE_CHECKING:
    from vramlab.load.fasthttp import Conn

MAX_FRAMING = 64 << 10
MAX_HEAD = MAX_FRAMING  # the name the first client used for the same bound
MAX_INTERIM = 16
MAX_ERROR_BODY = 64 << 10

# A sink gets the body of a 200 answer piece by piece: sink(data, stamp, exact) -> True when it has
# seen the end (the rest of the body is read and dropped, to keep the connection), raising nothing.
Sink = Callable[[bytes, float, bool], bool]


_FRAMING_NAME_LENGTHS = (len(b"content-length"), len(b"transfer-encoding"))


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


class _Malformed(Exception):
    """Raised inside a parser callback: the answer breaks a bound or a rule llhttp does not check."""


class Response:
    """The answers on one connection, one at a time (``start``): llhttp's callbacks collect each,
    ``feed`` hands each read's body to the sink. One parser per connection, not per answer: llhttp
    is ready for the next answer once one ends. A parser per request (each a reference cycle with
    its protocol object, left to the garbage collector) cost a quarter of the requests one client
    core completes (benchmarks/loadgen.py, rate mode: 15,155 against 21,063 per CPU-second)."""

    __slots__ = (
        "conn",
        "fut",
        "sink",
        "parser",
        "status",
        "keep",
        "got_any",
        "sink_done",
        "err_body",
        "framed",
        "headed",
        "complete",
        "interim",
        "framing",
        "pieces",
    )

    def __init__(
        self, conn: Conn, fut: asyncio.Future[tuple[int, str | None]] | None = None, sink: Sink | None = None
    ) -> None:
        self.conn = conn
        self.parser = HttpResponseParser(self)
        if fut is not None and sink is not None:
            self.start(fut, sink)

    def start(self, fut: asyncio.Future[tuple[int, str | None]], sink: Sink) -> None:
        """The next answer on this connection (the last one ended at a message boundary: a connection
        whose answer ended any other way is closed, never reused)."""
        self.fut, self.sink = fut, sink
        self.status = 0
        self.keep = True
        self.got_any = False
        self.sink_done = False
        self.err_body: bytearray | None = None
        self.framed = False  # a Content-Length or Transfer-Encoding: the body does not end at EOF
        self.headed = False  # the final (non-1xx) head has been read
        self.complete = False  # llhttp saw the answer's end
        self.interim = 0
        self.framing = 0  # bytes read since the last piece of body
        self.pieces: list[bytes] = []

    # -- llhttp's callbacks (inside feed_data) ---------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.framed and len(name) in _FRAMING_NAME_LENGTHS:
            n = name.lower()
            if n == b"content-length" or n == b"transfer-encoding":
                self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer: the real head follows
            self.interim += 1
            if self.interim > MAX_INTERIM:
                raise _Malformed(f"more than {MAX_INTERIM} interim (1xx) answers")
            self.framed = False
            return
        self.status, self.headed = status, True
        if status != 200:
            self.err_body = bytearray()

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_begin(self) -> None:
        if self.complete:
            raise _Malformed("bytes after the answer's end (more body than its Content-Length?)")

    def on_message_complete(self) -> None:
        if self.headed:
            self.complete = True
            # asked now: llhttp forgets the answer's flags once this callback returns
            self.keep = self.keep and self.parser.should_keep_alive()

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
        if self.headed and not self.framed and not self.complete:
            self._finish(False)  # a body delimited by the connection's close (HTTP/1.0 style)
        elif not self.got_any and self.conn.reused:
            self.fail(Retry())
        elif self.status == 0:
            self.fail(
                FastHttpError(
                    "stream_broken",
                    "ServerDisconnectedError: the server closed the connection before its answer",
                )
            )
        else:
            self.fail(
                FastHttpError(
                    "stream_broken", "ServerDisconnectedError: the server closed the connection mid-answer"
                )
            )

    def _malformed(self, why: str) -> None:
        self.fail(FastHttpError("stream_broken", f"malformed HTTP response: {why}"))

    # -- one read --------------------------------------------------------------------------------
    def feed(self, data: bytes, t: float) -> None:
        if not data:
            self._eof()
            return
        self.got_any = True
        try:
            self.parser.feed_data(data)
        except HttpParserCallbackError as exc:
            cause = exc.__context__
            self._malformed(
                str(cause) if isinstance(cause, _Malformed) else f"{type(cause).__name__}: {cause}"
            )
            return
        except HttpParserUpgrade:
            self._malformed("the server switched protocols (101)")
            return
        except HttpParserError as exc:
            why = str(exc) or type(exc).__name__
            self._malformed("bytes after the answer's end: " + why if self.complete else why)
            return
        pieces = self.pieces
        if pieces:
            self.framing = 0
            last = pieces[-1]
            piece = last if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            n = len(data)
            # exact: nothing but the chunk's closing CRLF follows the body in this read
            exact = (
                data.endswith(last)
                or (data.endswith(b"\r\n") and data.endswith(last, 0, n - 2))
                or (data.endswith(b"\r") and data.endswith(last, 0, n - 1))
            )
            if not self._body(piece, t, exact):
                return
        else:
            self.framing += len(data)
            if self.framing > MAX_FRAMING and not self.complete:
                self._malformed(
                    f"{MAX_FRAMING >> 10} KiB of headers, interim answers, chunk-size lines or "
                    "trailers without a byte of body"
                )
                return
        if self.complete:
            self._finish(True)

    def _body(self, data: bytes, t: float, exact: bool) -> bool:
        """Hand a read's body on; False when the answer ended here."""
        err = self.err_body
        if err is not None:
            room = MAX_ERROR_BODY - len(err)
            err += data[:room]
            if len(data) >= room and not self.complete:  # enough for the message; the rest is not waited for
                self.keep = False
                self._finish(False)
                return False
            return True
        if self.sink_done:  # the stream said it was done, and body still comes: end it here
            if not self.complete:
                self.keep = False
                self._finish(False)
                return False
            return True
        try:
            done = self.sink(data, t, exact)
        except StopBody:
            self.keep = False
            self._finish(False)
            return False
        except Exception as exc:  # a bug in the sink must not leave the request hanging
            self.fail(exc)
            return False
        if done:
            self.sink_done = True
        return True


__all__ = [
    "MAX_ERROR_BODY",
    "MAX_FRAMING",
    "MAX_HEAD",
    "MAX_INTERIM",
    "FastHttpError",
    "Response",
    "Retry",
    "Sink",
    "StopBody",
]
