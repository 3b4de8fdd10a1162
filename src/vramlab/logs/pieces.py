"""One file, read as the logs it holds: each writer (logs/split.py), each of several servers of one
engine writing at once (logs/processes.py), and each engine in a stream (logs/mixed.py) is parsed
as a log of its own, with the file's line numbers. What is not read is said, never dropped:
a writer whose lines are no known engine's, an engine whose lines hold no start-up, the engines
`--engine` leaves out.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from vramlab.errors import ConfigError, VramlabError
from vramlab.logs.detect import ParsedLog, detect_engine, engine_name, engine_scores, parse_log
from vramlab.logs.observation import SourceLine
from vramlab.logs.split import Stream


@dataclass
class Piece:
    label: str  # the file, and the writer/server/engine within it when there are several
    parsed: ParsedLog
    notes: list[str] = field(default_factory=list)


@dataclass
class FileRead:
    pieces: list[Piece]
    skipped: list[tuple[str, str]]  # (label, why it was not read)


def _streams(lines: list[str]) -> list[Stream]:
    from vramlab.logs.processes import split_servers
    from vramlab.logs.split import split_streams

    out: list[Stream] = []
    for st in split_streams(lines):
        servers = split_servers(st.lines)
        if servers is None:
            out.append(st)
            continue
        for sv in servers:  # numbers of the server's lines in the stream -> in the file
            numbers = type(sv.numbers)("L", (st.file_line(n) for n in sv.numbers)) if sv.numbers else None
            name = f"{st.name}, {sv.name}" if st.name else sv.name
            out.append(Stream(name, sv.lines, numbers[0] if numbers else sv.first_line, numbers))
    return out


def read_file(path: str, lines: list[str], engine: str | None, notes: list[str]) -> FileRead:
    """Every log in the file's lines. Raises ConfigError when none is a log of a known engine."""
    streams = _streams(lines)
    pieces: list[Piece] = []
    skipped: list[tuple[str, str]] = []
    for st in streams:
        label = f"{path} [{st.name}]" if st.name else path
        got, left = _read_stream(st, label, engine, notes, lines)
        if len(streams) > 1 and got:
            got[0].notes.append(
                f"{st.name}'s lines of {path} ({len(st.lines):,} of {len(lines):,}, from line {st.first_line})"
            )
        pieces += got
        skipped += left
    if not pieces:
        if len(streams) == 1 and len(skipped) == 1:
            raise ConfigError(skipped[0][1])
        raise ConfigError(
            f"{path}: none of its {len(streams)} writers wrote a log of a known engine"
            + (f" (first: {skipped[0][1]})" if skipped else "")
        )
    return FileRead(pieces, skipped)


def _read_stream(
    st: Stream, label: str, engine: str | None, notes: list[str], file_lines: list[str]
) -> tuple[list[Piece], list[tuple[str, str]]]:
    from vramlab.logs.mixed import engine_parts

    scores = engine_scores(st.lines)
    primary = engine_name(engine) if engine else detect_engine(st.lines, scores)
    if primary is None:
        from vramlab.logs.detect import PARSERS

        return [], [
            (label, f"{label}: no line of a known engine ({', '.join(PARSERS)}) found" + _where(notes))
        ]
    parts = engine_parts(st.lines, primary, scores)
    others = []
    if engine:  # the user named the engine: the others are said, not read
        others = [p for p in parts[1:] if p.engine != primary]
        parts = parts[:1]
    pieces: list[Piece] = []
    skipped: list[tuple[str, str]] = []
    for k, part in enumerate(parts):
        where = f"{label} [{part.engine}]" if len(parts) > 1 else label
        try:
            parsed = parse_log(part.lines, part.engine, label=where, notes=notes)
        except VramlabError as exc:
            if k == 0 or part.own_lines >= 3:  # a stray line of another engine is no log
                skipped.append((where, str(exc)))
            continue
        if k and not (parsed.observations or parsed.incomplete):
            if part.own_lines >= 3:
                skipped.append((where, f"{part.own_lines} lines of {part.engine}, but no start-up in them"))
            continue
        _renumber(parsed, st, file_lines)
        piece = Piece(where, parsed)
        if len(parts) > 1:
            piece.notes.append(
                f"{part.engine}'s lines, read apart from the "
                + ", ".join(p.engine for p in parts if p is not part)
                + " lines in the same stream"
            )
        pieces.append(piece)
    if engine and pieces:
        pieces[0].notes += [
            f"also holds {p.own_lines} line(s) of {p.engine}, not read: --engine {primary} was given"
            for p in others
        ]
    _share_failures(pieces)
    return sorted(pieces, key=_first_line), skipped


def _first_line(p: Piece) -> int:
    """Where a piece's log begins in the file: its first start-up or failure line."""
    seen = [s.line for o in p.parsed.observations + p.parsed.incomplete for s in o.source_lines]
    seen += [f.line_number for f in p.parsed.failures if f.line_number]
    return min(seen, default=0)


def _where(notes: Sequence[str]) -> str:
    return f" in {notes[0].removeprefix('read ')}" if notes else ""


def _renumber(parsed: ParsedLog, st: Stream, file_lines: list[str]) -> None:
    """The stream's line numbers -> the file's, with the file's text (a prefix split.py took off
    to read the line is back)."""
    if st.numbers is None:
        return

    def where(s: SourceLine) -> SourceLine:
        n = st.file_line(s.line)
        return SourceLine(line=n, text=file_lines[n - 1] or s.text if 0 < n <= len(file_lines) else s.text)

    for group in (parsed.observations, parsed.incomplete):
        for i, o in enumerate(group):
            group[i] = o.model_copy(update={"source_lines": [where(s) for s in o.source_lines]})
    parsed.failures = [
        dataclasses.replace(f, line_number=st.file_line(f.line_number)) if f.line_number else f
        for f in parsed.failures
    ]


def _share_failures(pieces: list[Piece]) -> None:
    """A failure line every engine's scan finds (a CUDA OOM, a kernel message) goes to the engine
    whose start-up line comes last before it."""
    if len(pieces) < 2:
        return

    starts = {
        id(p): sorted({s.line for o in p.parsed.observations + p.parsed.incomplete for s in o.source_lines})
        for p in pieces
    }

    def last_line_before(p: Piece, n: int) -> int:
        seen = starts[id(p)]
        k = bisect.bisect_right(seen, n)
        return seen[k - 1] if k else -1

    counts: dict[tuple[int | None, str], int] = {}
    for p in pieces:
        for f in p.parsed.failures:
            counts[(f.line_number, f.line)] = counts.get((f.line_number, f.line), 0) + 1
    for p in pieces:
        kept = []
        for f in p.parsed.failures:
            if counts[(f.line_number, f.line)] > 1 and f.line_number is not None:
                owner = max(pieces, key=lambda q: last_line_before(q, f.line_number or 0))
                if owner is not p:
                    continue
            kept.append(f)
        p.parsed.failures = kept


__all__ = ["FileRead", "Piece", "read_file"]
