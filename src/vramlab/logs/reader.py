"""Reading a log with bounds: bytes, line width, time, and memory.

The log is read block by block (1 MiB), split into lines as it comes, and each block's lines
pass through the prefilter (logs/prefilter.py) at once: a line no rule can read is kept as ''
(its number stays), so what stays in memory is the lines a parser needs plus a pointer per line,
not the file. A log at the 1 GiB ceiling of throughput and access lines costs a few hundred MiB,
not the several times its size that holding its text, its decoded copy and its lines did.

Every line's writer (a compose service, a journald unit, a k9s pod; logs/split.py) is noted as it
passes, before it may be blanked, so a file several writers share is still split by all of its
lines.
"""

from __future__ import annotations

from array import array
from pathlib import Path

from vramlab.errors import ConfigError

_BLOCK = 1 << 20


class LogLines(list):  # type: ignore[type-arg]
    """The lines of a log ('' for the ones the prefilter blanked), and what reading them left out."""

    truncated = False
    quiet: str | None = None  # why a pipe was left before its end
    prefiltered = False
    # Per line, an index into `writer_names` (0: no writer's prefix), when the reader noted them.
    writer_ids: array[int] | None = None
    writer_names: list[str | None]


def read_log(
    path: str | Path, max_bytes: int | None = None, max_line: int | None = None, prefilter: bool = True
) -> LogLines:
    """The lines of a log, read with bounds: at most `max_bytes` bytes, and a line longer than
    `max_line` characters keeps its start only, so a huge file, a FIFO or standard input cost
    bounded time and memory (`vramlab.infile` refuses devices and times out a silent pipe).
    `truncated` (on the returned list) says whether the cap was hit. With *prefilter*, lines past
    the head that no rule can read are blanked as they are read."""
    from vramlab.infile import PipeTimeout, open_input
    from vramlab.logs.base import MAX_LINE_CHARS, MAX_LOG_BYTES

    cap = MAX_LOG_BYTES if max_bytes is None else max_bytes
    width = MAX_LINE_CHARS if max_line is None else max_line
    p = Path(path)
    if str(path) != "-" and p.is_dir():
        raise ConfigError(f"{p}: is a folder; pass the folder to read every log in it")
    sink = _Sink(width, prefilter)
    total = 0
    try:
        with open_input(p, "log", pipes=True, stdin=True) as fh:
            while total < cap:
                block = fh.read1(min(_BLOCK, cap - total))  # type: ignore[attr-defined]
                if not block:
                    break
                total += len(block)
                sink.add(block)
    except PipeTimeout as exc:
        if not total:
            raise
        sink.lines.quiet = str(exc).split(": ", 1)[-1]  # a stream that went quiet: what came is read
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    lines = sink.close()
    lines.truncated = total >= cap
    return lines


class _Sink:
    """Bytes in, lines out: complete lines are decoded, cut to the width, their writer noted and
    prefiltered; an unfinished line waits for the next block (at most its kept start)."""

    def __init__(self, width: int, prefilter: bool) -> None:
        from vramlab.logs.prefilter import LinePrefilter

        self.width = width
        self.lines = LogLines()
        self.lines.prefiltered = prefilter
        self.lines.writer_ids = array("H")
        self.lines.writer_names = [None]
        self._ids: dict[str, int] = {}
        self._filter = LinePrefilter() if prefilter else None
        self._tail = bytearray()  # the unfinished last line
        self._tail_cut = False  # the unfinished line is longer than what is kept of it

    def add(self, block: bytes) -> None:
        start = 0
        if self._tail or self._tail_cut:  # the line the last block left unfinished
            nl = block.find(b"\n")
            if nl < 0:
                self._grow_tail(block)
                return
            # a line already cut keeps the start it has; the rest of it, up to its newline, is skipped
            line = bytes(self._tail) if self._tail_cut else bytes(self._tail) + block[:nl]
            self._tail, self._tail_cut = bytearray(), False
            self._take([line.decode("utf-8", errors="replace")])
            start = nl + 1
        cut = block.rfind(b"\n")
        if cut < start:
            self._grow_tail(block[start:])
            return
        self._take(block[start:cut].decode("utf-8", errors="replace").split("\n"))
        self._grow_tail(block[cut + 1 :])

    def _grow_tail(self, data: bytes) -> None:
        # 4 bytes per character at most: a kept start of `width` characters needs no more.
        room = 4 * self.width + 1 - len(self._tail)
        if room > 0:
            self._tail += data[:room]
        self._tail_cut = self._tail_cut or len(data) > room

    def close(self) -> LogLines:
        if self._tail:  # the last line, without its newline
            self._take([bytes(self._tail).decode("utf-8", errors="replace")])
        if self._filter is not None:
            self._store(self._filter.flush())
        return self.lines

    def _take(self, lines: list[str]) -> None:
        from vramlab.logs.split import writer_of

        width = self.width
        ids = self.lines.writer_ids
        assert ids is not None
        for i, line in enumerate(lines):
            if len(line) > width or line.endswith("\r"):
                # CRLF endings lose the CR; an over-long line (a pasted tensor, a blob) keeps its start only.
                lines[i] = line = line.rstrip("\r")[:width]
            name = writer_of(line) if line else None
            ids.append(0 if name is None else self._id(name))
        self._store(self._filter.feed(lines) if self._filter is not None else lines)

    def _id(self, name: str) -> int:
        found = self._ids.get(name)
        if found is None:
            if len(self._ids) >= 65_000:  # a name per line is no writer: count it as none
                return 0
            found = self._ids[name] = len(self.lines.writer_names)
            self.lines.writer_names.append(name)
        return found

    def _store(self, lines: list[str]) -> None:
        self.lines.extend(lines)


def read_notes(lines: list[str], max_bytes: int | None = None) -> list[str]:
    """What `read_log` left out of *lines*, in words: the byte cap, a pipe that went quiet."""
    notes = []
    if getattr(lines, "truncated", False):
        from vramlab.logs.base import MAX_LOG_BYTES

        cap = MAX_LOG_BYTES if max_bytes is None else max_bytes
        notes.append(f"read the first {cap:,} bytes only (the rest of the log was not read; see --max-bytes)")
    quiet = getattr(lines, "quiet", None)
    if quiet:
        notes.append(f"read up to where {quiet}")
    return notes


__all__ = ["LogLines", "read_log", "read_notes"]
