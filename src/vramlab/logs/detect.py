"""Pick the engine a log came from and parse it: the one entry point callers need.

result = parse_log(path_or_lines)           # engine detected
result = parse_log(lines, engine="sglang")  # engine given
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any

from vramlab.engines import ENGINES, aliases
from vramlab.errors import ConfigError, unknown
from vramlab.logs.base import iter_lines

# Each engine's start-up log parser and the other names it goes by: the engine registry's.
PARSERS: dict[str, ModuleType] = {name: import_module(e.log_parser) for name, e in ENGINES.items()}
ALIASES = aliases()

# Words that name an engine even on lines no rule reads (a log that stops early).
_MARKERS: dict[str, tuple[str, ...]] = {
    "vllm": ("vLLM", "vllm", "gpu_worker.py", "gpu_model_runner", "EngineCore", "VllmWorker"),
    "sglang": ("sglang", "ServerArgs(", "Load weight begin", "KV Cache is allocated", "max_total_num_tokens"),
    "tgi": (
        "text_generation_launcher",
        "text_generation_router",
        "text_generation_server",
        "KV-cache blocks",
    ),
    "llama.cpp": (
        "llama_model_loader",
        "load_tensors:",
        "ggml_cuda_init",
        "llama_context",
        "llama_kv_cache",
        "llama_new_context_with_model",
        "llama_init_from_model",
        "print_info:",
        "llama-server",
    ),
    "ollama": (
        "source=server.go",
        "source=sched.go",
        "source=memory.go",
        "source=routes.go",
        "ollama",
        "[GIN]",
    ),
    "transformers": ("[transformers] ", "transformers serve"),
}


# Signatures of the start-up kind that refuse a request, not the start-up itself.
_REQUEST_REFUSALS = ("sglang.input_too_long",)


@dataclass
class ParsedLog:
    engine: str
    observations: list[Any]  # complete start-ups, one Observation per rank
    incomplete: list[Any] = field(default_factory=list)  # start-ups the log cut short
    lines: int = 0
    source: str | None = None
    failures: list[Any] = field(default_factory=list)  # signatures.Signature, in order
    notes: list[str] = field(default_factory=list)  # what the reader had to leave out

    def phase(self, failure: Any) -> str:
        """'start-up' for a refusal to start, or a failure before the start-up it belongs to
        printed its KV decision (an OOM while loading); else 'serving'."""
        if failure.name in _REQUEST_REFUSALS:
            return "serving"
        if failure.kind == "startup_refusal" or failure.line_number is None:
            return "start-up"
        # the start-up the failure line falls in: the last one that began before it
        began = [
            (min(s.line for s in o.source_lines), o)
            for o in self.observations + self.incomplete
            if o.source_lines and min(s.line for s in o.source_lines) <= failure.line_number
        ]
        if not began:
            return "start-up"
        owner = max(began, key=lambda t: t[0])[1]
        # up: its KV decision printed, or (transformers serve, which sizes no pool) its server listening
        up = owner.complete or owner.extra.get("listen") is not None
        return (
            "serving" if up and max(s.line for s in owner.source_lines) < failure.line_number else "start-up"
        )


def engine_name(name: str) -> str:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in PARSERS:
        raise unknown("engine", name, list(PARSERS))
    return key


def detect_engine(lines: list[str]) -> str | None:
    """The engine whose rules read the most lines; markers break ties and cover short logs."""
    scores: dict[str, tuple[int, int]] = {}
    messages = [ln.message for ln in iter_lines(lines)]
    from vramlab.logs.base import candidates

    for name, module in PARSERS.items():
        rules = module.OWN_RULES if hasattr(module, "OWN_RULES") else module.RULES
        hits = sum(1 for msg in messages if any(r.pattern.search(msg) for r in candidates(rules, msg)))
        marks = sum(1 for msg in messages[:5000] if any(mk in msg for mk in _MARKERS[name]))
        scores[name] = (hits, marks)
    # Ollama embeds llama-server's lines: any Ollama-only line decides for Ollama.
    if scores["ollama"][0] > 0 or (scores["ollama"][1] > 0 and scores["llama.cpp"][0] > 0):
        return "ollama"
    best = max(scores, key=lambda n: scores[n])
    if scores[best] != (0, 0):
        return best
    # Nothing but a failure line (a pasted error): the failure's wording names the engine.
    from vramlab.logs.signatures import scan

    named = [sig.engine for sig in scan(lines) if sig.engine]
    return ALIASES.get(named[0], named[0]) if named else None


# A long log is mostly request and throughput lines no rule reads. Past its head (where the
# markers that name an engine are looked for), a line that contains none of the literals some rule
# or failure pattern needs is blanked before the per-engine passes: line numbers stay, and the
# regex work per engine and rule is left for the few lines that can match. Two ways to find them:
# a log of repeated line shapes (throughput, access lines) is searched once per shape; a log of
# unique lines (prompts logged) once per literal over the whole text, at C speed.
_HEAD_LINES = 5000
_DIGIT_BYTES = bytes.maketrans(b"123456789", b"000000000")  # a line's shape: its digits as 0
_NEEDS: list[tuple[list[str], list[re.Pattern[str]], re.Pattern[str]]] = []


def _needs() -> tuple[list[str], list[re.Pattern[str]], re.Pattern[str]]:
    """(literals, patterns, one regex of both): every line some rule can match contains one of
    the literals or matches one of the patterns."""
    if not _NEEDS:
        from vramlab.logs.base import literal_hints
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


def _blank_unread_lines(lines: list[str]) -> int:
    """Blank the lines past the head that no rule could match; how many were blanked."""
    if len(lines) <= _HEAD_LINES:
        return 0
    body = lines[_HEAD_LINES:]
    sample = {ln.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES) for ln in body[:2000]}
    keep = _keep_by_shape(body) if len(sample) < 200 else _keep_by_text(body)
    _keep_blocks(body, keep)
    blanked = 0
    for k, line in enumerate(body):
        if line and not keep[k]:
            lines[_HEAD_LINES + k] = ""
            blanked += 1
    return blanked


_BLOCK_LINES = 200  # TGI's pretty-printed `Args {` block, read as one line (logs/tgi.py)


def _keep_blocks(body: list[str], keep: bytearray) -> None:
    """A kept line that opens a block (`Args {`) keeps the lines up to its closing `}`."""
    k = 0
    while k < len(body):
        if keep[k] and body[k].rstrip().endswith("{"):
            end = min(len(body), k + 1 + _BLOCK_LINES)
            while k + 1 < end:
                k += 1
                keep[k] = 1
                if body[k].strip() == "}":
                    break
        k += 1


def _keep_by_shape(body: list[str]) -> bytearray:
    search = _needs()[2].search
    seen: dict[bytes, bool] = {}
    keep = bytearray(len(body))
    for k, line in enumerate(body):
        shape = line.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES)
        hit = seen.get(shape)
        if hit is None:
            hit = search(shape.decode("utf-8", "surrogatepass")) is not None
            if len(seen) < 100_000:
                seen[shape] = hit
        keep[k] = hit
    return keep


def _keep_by_text(body: list[str]) -> bytearray:
    import bisect
    import itertools

    literals, patterns, _ = _needs()
    text = "\n".join(body)
    starts = list(itertools.accumulate((len(x) + 1 for x in body), initial=0))
    keep = bytearray(len(body) + 1)
    for lit in literals:
        i = text.find(lit)
        while i >= 0:
            k = bisect.bisect_right(starts, i) - 1
            keep[k] = 1
            i = text.find(lit, starts[k + 1])  # the next line: one hit per line is enough
    for pat in patterns:
        for m in pat.finditer(text):  # a match may run over a newline: keep both ends' lines
            keep[bisect.bisect_right(starts, m.start()) - 1] = 1
            keep[bisect.bisect_right(starts, max(m.start(), m.end() - 1)) - 1] = 1
    return keep


def read_log(path: str | Path, max_bytes: int | None = None, max_line: int | None = None) -> list[str]:
    """The lines of a log, read with bounds: at most `max_bytes` bytes, in large blocks (one pass
    at disk speed), and a line longer than `max_line` characters keeps its start only, so a huge
    file, a FIFO or standard input cost bounded time and memory (`vramlab.infile` refuses devices
    and times out a silent pipe). `truncated` (on the returned list) says whether the cap was hit."""
    from vramlab.infile import PipeTimeout, open_input
    from vramlab.logs.base import MAX_LINE_CHARS, MAX_LOG_BYTES

    cap = MAX_LOG_BYTES if max_bytes is None else max_bytes
    width = MAX_LINE_CHARS if max_line is None else max_line
    p = Path(path)
    if str(path) != "-" and p.is_dir():
        raise ConfigError(f"{p}: is a folder; pass the folder to read every log in it")
    buf = bytearray()
    quiet = None
    try:
        with open_input(p, "log", pipes=True, stdin=True) as fh:
            while len(buf) < cap:
                block = fh.read1(min(1 << 20, cap - len(buf)))  # type: ignore[attr-defined]
                if not block:
                    break
                buf += block
    except PipeTimeout as exc:
        if not buf:
            raise
        quiet = str(exc).split(": ", 1)[-1]  # a stream that went quiet: what came is read
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    total = len(buf)
    # Logs are UTF-8 in practice; a stray byte must not stop the parse.
    lines = _Lines(buf.decode("utf-8", errors="replace").split("\n"))
    del buf
    if lines and not lines[-1]:
        lines.pop()  # the newline that ends the last line
    for i, line in enumerate(lines):
        if len(line) > width or line.endswith("\r"):
            # CRLF endings lose the CR; an over-long line (a pasted tensor, a blob) keeps its start only.
            lines[i] = line.rstrip("\r")[:width]
    lines.truncated = total >= cap
    lines.quiet = quiet
    return lines


class _Lines(list):  # type: ignore[type-arg]
    truncated = False
    quiet: str | None = None  # why a pipe was left before its end


_DIFF_LINE = re.compile(r"^[-+](?![-+]{2})\S")


def diff_sides(lines: list[str]) -> tuple[list[str], list[str]] | None:
    """The two sides of a pasted unified diff (lines led by '-', '+' or ' '), or None."""
    marked = [ln for ln in lines if _DIFF_LINE.match(ln)]
    minus = sum(1 for ln in marked if ln.startswith("-"))
    if minus < 2 or len(marked) - minus < 2:
        return None
    if any(ln and ln[0] not in "-+ @" for ln in lines):
        return None  # unmarked lines: not a diff
    before = [ln[1:] for ln in lines if ln[:1] in ("-", " ")]
    after = [ln[1:] for ln in lines if ln[:1] in ("+", " ")]
    return before, after


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


def parse_log(
    source: str | Path | Iterable[str],
    engine: str | None = None,
    max_bytes: int | None = None,
    label: str | None = None,
    notes: list[str] | None = None,
) -> ParsedLog:
    """Parse a log file (path) or its lines. Never needs the model, the GPU or the version.
    *notes*: what reading the lines left out (`read_notes`), kept in the result and named in
    the error when no engine is found.

    Raises ConfigError only when nothing in it is recognizable: no memory line, no setting
    and no failure of a known engine."""
    from vramlab.logs.signatures import scan

    notes = list(notes or [])
    if isinstance(source, (str, Path)):
        label = label or str(source)
        read = read_log(source, max_bytes)
        notes += read_notes(read, max_bytes)
        lines = list(read)
    else:
        lines = list(source)
    _blank_unread_lines(lines)  # a copy: the caller's lines stay whole
    name = engine_name(engine) if engine else detect_engine(lines)
    if name is None:
        raise ConfigError(
            f"{label or 'log'}: no line of a known engine ({', '.join(PARSERS)}) found"
            + (f" in {notes[0].removeprefix('read ')}" if notes else "")
        )
    sides = diff_sides(lines)
    if sides is None:
        found = PARSERS[name].parse(lines)
    else:  # a before/after diff of two start-ups: each side on its own, never summed
        notes.append("the excerpt is a diff: its '-' and '+' sides are read as two start-ups")
        before, after = (PARSERS[name].parse(side) for side in sides)
        shift = 1 + max((o.startup or 0 for o in before), default=0)
        found = before + [o.model_copy(update={"startup": (o.startup or 0) + shift}) for o in after]
    if label:
        found = [o.model_copy(update={"source": label}) for o in found]
    # Ollama runs llama.cpp: its lines carry llama.cpp's failure wording too.
    failures = scan(lines, None if name == "ollama" else name)
    if name == "ollama":
        failures = [f for f in failures if f.engine in (None, "ollama", "llama.cpp")]
    complete = [o for o in found if o.complete]
    incomplete = [o for o in found if not o.complete]
    if not found and not failures:
        raise ConfigError(
            f"{label or 'log'}: looks like {name}, but no start-up memory line, setting or failure was "
            "found (the engine prints them while it loads the model; see docs/logs-and-calibration.md)"
        )
    return ParsedLog(name, complete, incomplete, len(lines), label, failures, notes)
