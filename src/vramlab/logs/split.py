"""One file, several writers: split a log into the streams that wrote it before any engine reads it.

`docker compose logs` and `journalctl` put the writer's name in front of every line
("vllm-1  | INFO ...", "Jan 12 10:00:01 gpu01 sglang[412]: ..."). A file that interleaves two
containers (a vLLM and an SGLang server started side by side) is two logs, and an engine parser
reading it whole keeps one engine and drops the other. Split first, then read each stream as the
log it is; within a stream the engine's own start-up lines split its restarts (logs/base.py).

Pure: lines in, named streams out.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# The writer's name in the shippers' prefixes that carry one (logs/base.py strips the same prefixes).
_COMPOSE = re.compile(r"^\s*(?P<name>[\w.-]+)\s+\|\s")
_JOURNAL = re.compile(r"^[A-Z][a-z]{2} +\d{1,2} [\d:]{8} \S+ (?P<name>[\w.@/-]+?)(?:\[\d+\])?: ")
MIN_STREAM_LINES = 3  # a name seen on fewer lines is a stray, not a writer


@dataclass(frozen=True)
class Stream:
    name: str | None  # the writer (a compose service, a journald unit); None: the file is one stream
    lines: list[str]
    first_line: int  # where the stream begins in the file (1-based)


def writer_of(line: str) -> str | None:
    m = _COMPOSE.match(line) or _JOURNAL.match(line)
    return m.group("name") if m else None


def split_streams(lines: list[str]) -> list[Stream]:
    """The file's writers, each with its own lines in order; one stream when there is one writer.
    A line without a writer's prefix (a wrapped traceback) stays with the writer before it."""
    names = [writer_of(ln) for ln in lines]
    counts = Counter(n for n in names if n is not None)
    writers = {n for n, c in counts.items() if c >= MIN_STREAM_LINES}
    # most lines must carry a writer's name: a few table rows that look like "name | ..." do not
    if len(writers) < 2 or sum(counts[n] for n in writers) < len(lines) / 2:
        return [Stream(None, lines, 1)]
    out: dict[str, list[str]] = {}
    first: dict[str, int] = {}
    last: str | None = None
    for i, (ln, n) in enumerate(zip(lines, names, strict=True), start=1):
        n = n if n in writers else last
        if n is None:
            continue  # before any writer spoke: nobody to give it to
        out.setdefault(n, []).append(ln)
        first.setdefault(n, i)
        last = n
    return [Stream(n, out[n], first[n]) for n in sorted(out, key=lambda k: first[k])]


__all__ = ["MIN_STREAM_LINES", "Stream", "split_streams", "writer_of"]
