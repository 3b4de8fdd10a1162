"""Which lines of a long log some rule could read: the rest are blanked before any engine parses.

A long log is mostly request and throughput lines no rule reads. Past its head (where the markers
that name an engine are looked for), a line that contains none of the literals some rule or
failure pattern needs is blanked: its number stays, and the regex work per engine and rule is left
for the few lines that can match. Two ways to find them: a log of repeated line shapes
(throughput, access lines) is searched once per shape; a log of unique lines (prompts logged) once
per literal over a block of text, at C speed.

`LinePrefilter` decides as the lines arrive (logs/reader.py reads a log block by block), so a
blanked line is never held in memory; `blank_unread_lines` does the same over a list in place.
"""

from __future__ import annotations

import bisect
import itertools
import re
from typing import Any

HEAD_LINES = 5000
_SAMPLE_LINES = 2000  # body lines looked at to choose between the two ways
_DIGIT_BYTES = bytes.maketrans(b"123456789", b"000000000")  # a line's shape: its digits as 0
_BLOCK_LINES = 200  # TGI's pretty-printed `Args {` block, read as one line (logs/tgi.py)
_NEEDS: list[tuple[list[str], list[re.Pattern[str]], re.Pattern[str]]] = []


def _needs() -> tuple[list[str], list[re.Pattern[str]], re.Pattern[str]]:
    """(literals, patterns, one regex of both): every line some rule can match contains one of
    the literals or matches one of the patterns."""
    if not _NEEDS:
        from vramlab.logs.base import literal_hints
        from vramlab.logs.detect import PARSERS
        from vramlab.logs.signatures import PATTERNS

        literals: set[str] = {"\x1b", '"message"'}  # colour codes and JSON lines are rewritten first
        others: set[str] = set()
        patterns = [
            r.pattern.pattern for m in PARSERS.values() for r in (*m.RULES, *getattr(m, "OWN_RULES", ()))
        ]
        for pattern in [*patterns, *(p.regex.pattern for p in PATTERNS)]:
            hints = literal_hints(pattern)
            if hints:
                literals.update(hints)
            elif pattern.startswith(r"^\s+--"):  # a pasted command's continuation lines
                others.add(r"\s--?[A-Za-z]")
            else:  # no literal to look for: the pattern itself, unanchored
                others.add(pattern.removeprefix("^"))
        short: list[str] = []  # a literal that contains another is found through the shorter one
        for lit in sorted(literals, key=len):
            if not any(s in lit for s in short):
                short.append(lit)
        digitless = [lit.translate(str.maketrans("123456789", "000000000")) for lit in short]
        shape = re.compile("|".join([_trie(set(digitless)), *sorted(others)]))
        _NEEDS.append((short, [re.compile(p) for p in sorted(others)], shape))
    return _NEEDS[0]


def _trie(words: set[str]) -> str:
    """An alternation of *words* as a prefix tree (Python's regex engine tries a flat alternation
    word by word at every position, a tree a character at a time)."""
    root: dict[str, Any] = {}
    for w in sorted(words, key=len):
        node = root
        for ch in w:
            if "" in node:
                break  # a shorter word is a prefix of this one: it is found through that one
            node = node.setdefault(ch, {})
        else:
            node.clear()
            node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")" if alts else ""

    return emit(root)


def _shape(line: str) -> bytes:
    return line.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES)


class LinePrefilter:
    """Blanks, batch by batch, the body lines no rule can read. The first `HEAD_LINES` lines pass
    whole; the first `_SAMPLE_LINES` of the body choose the way (by shape when they have fewer
    than 200 shapes, else by text) and wait until they are in."""

    def __init__(self) -> None:
        self.seen = 0  # lines fed so far
        self.blanked = 0
        self._by_shape: bool | None = None
        self._shapes: dict[bytes, bool] = {}
        self._pending: list[str] = []  # body lines that wait for the choice
        self._block_left = 0  # lines an open `Args {` block still keeps

    def feed(self, lines: list[str]) -> list[str]:
        """*lines*, the next ones of the log, as they are to be kept ('' for a blanked line). Lines
        of the sample come back only once the sample is complete (or at `flush`)."""
        head = max(0, min(len(lines), HEAD_LINES - self.seen))
        self.seen += len(lines)
        out = lines[:head]
        body = lines[head:]
        if not body:
            return out
        if self._by_shape is None:
            self._pending.extend(body)
            if len(self._pending) < _SAMPLE_LINES:
                return out
            body, self._pending = self._pending, []
            self._choose(body)
        return out + self._filter(body)

    def flush(self) -> list[str]:
        """The sample's lines when the log ended before the sample was complete."""
        body, self._pending = self._pending, []
        if not body:
            return []
        self._choose(body)
        return self._filter(body)

    def _choose(self, body: list[str]) -> None:
        sample = {_shape(ln) for ln in body[:_SAMPLE_LINES]}
        self._by_shape = len(sample) < 200

    def _filter(self, body: list[str]) -> list[str]:
        keep = self._keep_by_shape(body) if self._by_shape else _keep_by_text(body)
        self._keep_blocks(body, keep)
        out = [line if keep[k] or not line else "" for k, line in enumerate(body)]
        self.blanked += sum(1 for k, line in enumerate(body) if line and not keep[k])
        return out

    def _keep_by_shape(self, body: list[str]) -> bytearray:
        search = _needs()[2].search
        seen = self._shapes
        keep = bytearray(len(body))
        for k, line in enumerate(body):
            shape = _shape(line)
            hit = seen.get(shape)
            if hit is None:
                hit = search(shape.decode("utf-8", "surrogatepass")) is not None
                if len(seen) < 100_000:
                    seen[shape] = hit
            keep[k] = hit
        return keep

    def _keep_blocks(self, body: list[str], keep: bytearray) -> None:
        """A kept line that opens a block (`Args {`) keeps the lines up to its closing `}`, across
        batches."""
        k = 0
        while k < len(body):
            if self._block_left:
                keep[k] = 1
                self._block_left = 0 if body[k].strip() == "}" else self._block_left - 1
            elif keep[k] and body[k].rstrip().endswith("{"):
                self._block_left = _BLOCK_LINES
            k += 1


def _keep_by_text(body: list[str]) -> bytearray:
    literals, patterns, _ = _needs()
    # A leading newline: a pattern that begins with whitespace finds the first line's start too.
    text = "\n" + "\n".join(body)
    starts = list(itertools.accumulate((len(x) + 1 for x in body), initial=1))
    keep = bytearray(len(body) + 1)
    for lit in literals:
        i = text.find(lit)
        while i >= 0:
            k = max(0, bisect.bisect_right(starts, i) - 1)
            keep[k] = 1
            i = text.find(lit, starts[k + 1])  # the next line: one hit per line is enough
    for pat in patterns:
        for m in pat.finditer(text):  # a match may run over a newline: keep both ends' lines
            keep[max(0, bisect.bisect_right(starts, m.start()) - 1)] = 1
            keep[max(0, bisect.bisect_right(starts, max(m.start(), m.end() - 1)) - 1)] = 1
    return keep


def blank_unread_lines(lines: list[str]) -> int:
    """Blank, in place, the lines past the head that no rule could match; how many were blanked."""
    if len(lines) <= HEAD_LINES:
        return 0
    f = LinePrefilter()
    kept = f.feed(list(lines)) + f.flush()
    lines[:] = kept
    return f.blanked


__all__ = ["HEAD_LINES", "LinePrefilter", "blank_unread_lines"]
