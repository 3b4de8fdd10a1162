"""Bounded GETs for the pollers (/metrics, the Prometheus API, health, Ollama's API).

A poller runs beside the load, in the same event loop: an answer that is huge, a compression bomb
or slow to parse would take the memory and the CPU the load generator times with, and its lag
would read as the server's latency. So, like the load client (vramlab.load), every poll is bounded:

- **time**: the session's total timeout (the sampler's interval, at least 2 s) covers connecting,
  the head and the body;
- **bytes on the wire**: a Content-Length over the cap is not read at all; a body is read in
  pieces and reading stops at the cap (`BodyTooLarge`, or the first `max_bytes` with `truncated`
  for an uncompressed text format that can be read in part, as /metrics);
- **bytes after decompression**: aiohttp's automatic decompression is off; gzip and deflate are
  inflated here with `max_length`, so a bomb stops at the cap as well (`BodyTooLarge` saying so);
  an encoding vramlab does not read (br, zstd: never asked for) is refused, not guessed;
- **CPU**: a body over `THREAD_BYTES` is parsed in a worker thread (`parse_off_loop`), so the event
  loop that sends the load keeps running while a large answer is read.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

KIB, MIB = 1 << 10, 1 << 20
THREAD_BYTES = 64 * KIB  # a body this big is parsed off the event loop
_PIECE = 64 * KIB


class BodyTooLarge(ValueError):
    """The answer (as sent or once decompressed) is bigger than the poller reads."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    truncated: bool = False  # the body was longer than the cap: this is its first part


def session(timeout_s: float, headers: dict[str, str] | None = None) -> Any:
    """An aiohttp session for a poller: decompression off (done here, bounded), the timeout set."""
    import aiohttp

    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        auto_decompress=False,
        headers={"Accept-Encoding": "gzip, deflate", **(headers or {})},
    )


async def get(
    s: Any, url: str, max_bytes: int, *, params: dict[str, str] | None = None, partial: bool = False
) -> Answer:
    """GET *url*: the status and at most *max_bytes* of its body, decompressed. Past the cap:
    `BodyTooLarge`, or with *partial* the first *max_bytes* (a text format read line by line)."""
    async with s.get(url, params=params) as resp:
        encodings = [
            e.strip().lower() for e in resp.headers.get("Content-Encoding", "").split(",") if e.strip()
        ]
        encodings = [e for e in encodings if e != "identity"]
        length = resp.content_length
        if length is not None and length > max_bytes and not (partial and not encodings):
            raise BodyTooLarge(
                f"answer of {_size(length)} (Content-Length), over the {_size(max_bytes)} read"
            )
        raw, more = await _read(resp, max_bytes)
        if more and (encodings or not partial):
            raise BodyTooLarge(
                f"answer over {_size(max_bytes)}{' (compressed)' if encodings else ''}, not read"
            )
        body, cut = decode(raw, encodings, max_bytes)
        if cut and (encodings or not partial):  # never the first part of a bomb: it is not read at all
            raise BodyTooLarge(
                f"answer inflates past {_size(max_bytes)} ({'+'.join(encodings)}: a compression bomb?), not read"
            )
        return Answer(resp.status, body, more or cut)


async def _read(resp: Any, max_bytes: int) -> tuple[bytes, bool]:
    """At most *max_bytes* of the body as sent; whether more was there."""
    buf = bytearray()
    while len(buf) <= max_bytes:
        piece = await resp.content.read(min(_PIECE, max_bytes + 1 - len(buf)))
        if not piece:
            return bytes(buf), False
        buf += piece
    return bytes(buf[:max_bytes]), True


def decode(raw: bytes, encodings: list[str], max_bytes: int) -> tuple[bytes, bool]:
    """*raw* undone through its Content-Encodings (last applied first), never past *max_bytes*;
    whether the cap cut it. An encoding other than gzip or deflate is a ValueError."""
    out, cut = raw, False
    for enc in reversed(encodings):
        if enc in ("gzip", "x-gzip"):
            out, more = _inflate(out, 16 + zlib.MAX_WBITS, max_bytes)
        elif enc == "deflate":  # zlib-wrapped as the RFC says, or raw deflate as some servers send
            try:
                out, more = _inflate(out, zlib.MAX_WBITS, max_bytes)
            except zlib.error:
                out, more = _inflate(out, -zlib.MAX_WBITS, max_bytes)
        else:
            raise ValueError(
                f"answer in {enc!r} encoding, which vramlab does not read (it asks for gzip or deflate)"
            )
        cut = cut or more
    return out, cut


def _inflate(data: bytes, wbits: int, max_bytes: int) -> tuple[bytes, bool]:
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise ValueError(f"a compressed answer that does not inflate ({exc})") from None
    if len(out) > max_bytes or d.unconsumed_tail:
        return out[:max_bytes], True
    return out, False


async def parse_off_loop(parse: Callable[[bytes], T], body: bytes) -> T:
    """*parse*(body), in a worker thread when the body is large, so the load's loop keeps running."""
    if len(body) < THREAD_BYTES:
        return parse(body)
    return await asyncio.to_thread(parse, body)


def _size(n: int) -> str:
    return f"{n / MIB:.0f} MiB" if n >= MIB else f"{n / KIB:.0f} KiB" if n >= KIB else f"{n} bytes"
