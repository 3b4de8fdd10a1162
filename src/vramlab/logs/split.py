"""One file, several writers: split a log into the streams that wrote it before any engine reads it.

`docker compose logs`, `journalctl` and k9s put the writer's name in front of every line
("vllm-1  | INFO ...", "Jan 12 10:00:01 gpu01 sglang[412]: ...", "vllm-7d9f8b6c4-x2k9p vllm INFO
..."). A file that interleaves two containers (a vLLM and an SGLang server started side by side)
is two logs, and an engine parser reading it whole keeps one engine and drops the other. Split
first, then read each stream as the log it is; within a stream the engine's own start-up lines
split its restarts (logs/base.py), and logs/mixed.py finds several engines in one stream.

journald names a process by its command and pid (`python3[412]`): two engines both run by
`python3` share the name, so two pids of one name whose lines interleave are two writers; one pid
after another (a restart) is one.

Pure: lines in, named streams out, each with the file's line number of every line it holds.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# The writer's name in the shippers' prefixes that carry one (logs/base.py strips the first two).
_COMPOSE = re.compile(r"^\s*(?P<name>[\w.-]+)\s+\|\s")
_JOURNAL = re.compile(r"^[A-Z][a-z]{2} +\d{1,2} [\d:]{8} \S+ (?P<name>[\w.@/-]+?)(?P<pid>\[\d+\])?: ")
# k9s (internal/dao/log_item.go `Render`): "POD CONTAINER line" when several pods or containers are
# shown, inside the frame "│ ... │" when the screen was copied. A pod name of a Deployment ends in
# its 5-character suffix, a StatefulSet's in its ordinal.
_K9S = re.compile(
    r"^(?:\u2502 ?)?(?P<name>[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?-(?:[a-z0-9]{5}|\d{1,3})"
    r"(?: [a-z0-9](?:[a-z0-9-]*[a-z0-9])?)?) (?=\S)"
)
K9S_MARK = "\u2063"  # in a writer's name: the prefix is k9s's, which logs/base.py does not strip
MIN_STREAM_LINES = 3  # a name seen on fewer lines is a stray, not a writer


@dataclass(frozen=True)
class Stream:
    name: str | None  # the writer (a compose service, a journald unit); None: the file is one stream
    lines: list[str]
    first_line: int  # where the stream begins in the file (1-based)
    numbers: array[int] | None = None  # the file's line number of each line; None: 1, 2, 3, ...

    def file_line(self, n: int) -> int:
        """The file's line number of the stream's line *n* (1-based)."""
        if self.numbers is None or not 1 <= n <= len(self.numbers):
            return n
        return self.numbers[n - 1]


def writer_of(line: str) -> str | None:
    """The writer a line's prefix names: `service`, `unit[pid]` or k9s's `pod container`."""
    m = _COMPOSE.match(line)
    if m:
        return m.group("name")
    m = _JOURNAL.match(line)
    if m:
        return m.group("name") + (m.group("pid") or "")
    m = _K9S.match(line)
    if m:
        return K9S_MARK + m.group("name")
    return None


def _base(name: str) -> str:
    return name.split("[", 1)[0]


def _merge_pids(first: dict[str, int], last: dict[str, int]) -> dict[str, str]:
    """journald `name[pid]` -> the writer it is: the name, unless pids of that name overlap in the
    file (two processes writing at once), then the name with its pid."""
    by_base: dict[str, list[str]] = {}
    for key in first:
        by_base.setdefault(_base(key), []).append(key)
    out: dict[str, str] = {}
    for base, keys in by_base.items():
        spans = sorted((first[k], last[k]) for k in keys)
        overlap = any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
        for k in keys:
            out[k] = k if overlap and len(keys) > 1 else base
    return out


def _names(lines: Sequence[str]) -> tuple[list[int], list[str | None]]:
    ids = getattr(lines, "writer_ids", None)
    if ids is not None and len(ids) == len(lines):
        return ids, lines.writer_names  # type: ignore[attr-defined]  # noted by logs/reader.py
    table: dict[str, int] = {}
    names: list[str | None] = [None]
    out = []
    for ln in lines:
        n = writer_of(ln) if ln else None
        if n is None:
            out.append(0)
            continue
        if n not in table:
            table[n] = len(names)
            names.append(n)
        out.append(table[n])
    return out, names


def split_streams(lines: Sequence[str]) -> list[Stream]:
    """The file's writers, each with its own lines in order; one stream when there is one writer.
    A line without a writer's prefix (a wrapped traceback) stays with the writer before it."""
    ids, names = _names(lines)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, w in enumerate(ids):
        if w:
            key = names[w]
            assert key is not None
            first.setdefault(key, i)
            last[key] = i
    writer = _merge_pids(first, last)
    counts: Counter[str] = Counter()
    for w, c in Counter(ids).items():
        if w:
            counts[writer[names[w]]] += c  # type: ignore[index]
    writers = {n for n, c in counts.items() if c >= MIN_STREAM_LINES}
    k9s = any(n.startswith(K9S_MARK) for n in writers)
    # most lines must carry a writer's name: a few table rows that look like "name | ..." do not
    if sum(counts[n] for n in writers) < len(lines) / 2 or (len(writers) < 2 and not k9s):
        return [Stream(None, lines if isinstance(lines, list) else list(lines), 1)]
    out: dict[str, list[str]] = {}
    numbers: dict[str, array[int]] = {}
    cur: str | None = None
    for i, (ln, w) in enumerate(zip(lines, ids, strict=True), start=1):
        name = writer[names[w]] if w else None  # type: ignore[index]
        cur = name if name in writers else cur
        if cur is None:
            continue  # before any writer spoke: nobody to give it to
        out.setdefault(cur, []).append(_message(ln) if cur.startswith(K9S_MARK) and ln else ln)
        numbers.setdefault(cur, array("L")).append(i)
    order = sorted(out, key=lambda k: numbers[k][0])
    if len(order) == 1:  # one k9s writer: the prefix stripped, the file's numbers kept
        return [Stream(None, out[order[0]], numbers[order[0]][0], numbers[order[0]])]
    return [Stream(n.removeprefix(K9S_MARK), out[n], numbers[n][0], numbers[n]) for n in order]


def _message(line: str) -> str:
    """A line without k9s's `POD CONTAINER ` (the frame kept: logs/base.py strips it)."""
    m = _K9S.match(line)
    if not m:
        return line
    frame = "\u2502 " if line.startswith("\u2502") else ""
    return frame + line[m.end() :]


__all__ = ["MIN_STREAM_LINES", "Stream", "split_streams", "writer_of"]
