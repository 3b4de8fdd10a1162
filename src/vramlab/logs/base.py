"""The machinery every engine parser shares: line prefixes, units, and grouping by rank.

An engine parser is a list of `Rule`s. Each rule is a regular expression searched in the
message part of a line and a function that turns the match into fields of an `Observation`
(`weights_bytes`, `settings.max_model_len`, ...). `parse_lines` feeds every line to every rule,
groups what it finds by worker rank and by start-up, and returns observations. A line no rule
matches is skipped; a rule that cannot read its match (a garbled number) is skipped too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vramlab.units import GIB

MIB = 1 << 20
# Bounds on what a log may cost to read: a line longer than this is cut (engine lines are far
# shorter; a pasted tensor or /dev/zero is not), and reading stops after MAX_LOG_BYTES.
MAX_LINE_CHARS = 64 * 1024
MAX_LOG_BYTES = 64 * MIB

# Fields that carry memory figures: an observation needs one of them to be worth reporting.
MEMORY_FIELDS = (
    "weights_bytes",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "activation_peak_bytes",
    "non_torch_bytes",
    "cuda_graph_bytes",
    "gpu_blocks",
)
# Host memory a CPU (or part-offloaded) start-up allocates: once seen, the next start-up line opens a new one.
HOST_FIELDS = ("extra.host_weights_bytes", "extra.kv_total_bytes", "extra.host_compute_bytes")
# The engine's KV decision: without it a start-up is incomplete (a truncated log).
COMPLETE_FIELDS = ("kv_cache_bytes", "kv_cache_tokens", "gpu_blocks")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Colour codes whose ESC byte was lost on the way into an issue ("[34m1.14.608.510[0m [32mI [0m").
_BARE_SGR = re.compile(r"\[(?:\d{1,3}(?:;\d{1,3})*)?m")
# What log shippers and terminals put in front of an engine's own line, outermost first. Each is
# stripped once, in this order, before the worker prefix is looked at.
_OUTER_PREFIXES = (
    re.compile(r"^\s*[\u2502|]\s?"),  # k9s frame / Buildkite column: "│ INFO ...", "  | [..] ERROR ..."
    re.compile(r"^[A-Z][a-z]{2} +\d{1,2} [\d:]{8} \S+ [\w.@/-]+(?:\[\d+\])?: "),  # journald/syslog
    re.compile(r"^[\w.-]+\s+\|\s"),  # docker compose: "ollama  | ", "vllm-1  | "
    re.compile(r"^\[\d{4}-\d\d-\d\dT[\d:.]+Z?\]\s*"),  # "[2025-08-12T08:42:32Z] "
    re.compile(r"^(?:\[\d+\] )?\d+\.\d\d\.\d{3}\.\d{3} [IDWE] "),  # llama.cpp timestamps: "1.14.608.510 I "
)
# First characters of lines that carry no shipper prefix (vLLM "INFO", "(EngineCore", "llama_").
_ENGINE_FIRST = set("(IWDE")
_FRAME_END = re.compile(r"\s*\u2502\s*$")
# vLLM worker prefixes: (VllmWorker rank=1 pid=..), (VllmWorker TP1 pid=..), (Worker_TP1 pid=..),
# (VllmWorkerProcess pid=..), (RayWorkerWrapper pid=.., ip=..), (EngineCore_DP0 pid=..).
_PAREN_PREFIX = re.compile(r"^\s*\((?P<who>[A-Za-z_][\w-]*)(?P<args>[^()]*)\)\s*")
# SGLang: [2025-01-01 12:00:00 TP1] or [2025-01-01 12:00:00 DP0 TP1] or [gpu_id=1].
_BRACKET_PREFIX = re.compile(r"^\s*\[(?P<inside>[^\]]*?(?:\bTP\d+|gpu_id=\d+)[^\]]*)\]\s*")
_ENGINE_LEVEL = ("EngineCore", "APIServer", "LLMEngine", "AsyncLLM", "MQLLMEngine")


# A number as engines print it: thousands grouped by commas (or not), a fraction after. _plain drops
# the commas, and refuses (ValueError) a garbled group: "1,2,,6" without its commas was read as 126.
_GROUPED = re.compile(r"^-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$")


def _plain(text: str) -> str:
    t = text.strip().replace("_", "")
    if "," in t and not _GROUPED.match(t):
        raise ValueError(f"not a number: {text!r}")
    return t.replace(",", "")


def gib(text: str) -> int:
    """'12.56' GiB -> bytes. vLLM and SGLang print 'GB' for GiB too (they divide by 2^30)."""
    return int(round(float(_plain(text)) * GIB))


def mib(text: str) -> int:
    return int(round(float(_plain(text)) * MIB))


_UNIT = {"b": 1, "kib": 1 << 10, "kb": 1 << 10, "mib": MIB, "mb": MIB, "gib": GIB, "gb": GIB, "tib": 1 << 40}


def sized(number: str, unit: str) -> int:
    """'6.5', 'GiB' -> bytes. Engines that print 'GB' mean GiB (2^30) in every case we read."""
    return int(round(float(_plain(number)) * _UNIT[unit.lower()]))


def integer(text: str) -> int:
    """'1,505,552' -> 1505552 (vLLM groups thousands with commas since V1); '1,2,,6' is a ValueError."""
    return int(_plain(text))


@dataclass(frozen=True)
class Line:
    number: int  # 1-based line number in the log
    raw: str  # the line as read (newline removed)
    message: str  # the line without ANSI colours and worker prefix
    rank_key: str | None  # which worker printed it, None when the log does not say


FlagTable = Iterable[tuple[tuple[str, ...], str, Callable[[str], Any]]]


def command_flags(text: str, table: FlagTable, value: str = r"[^\s\\]+") -> dict[str, Any]:
    """Settings read off a pasted command line: for each (flags, key, convert), the first of the flags given
    (`--flag value` or `--flag=value`) sets key; a value that does not convert is skipped, never guessed."""
    out: dict[str, Any] = {}
    for flags, name, conv in table:
        for flag in flags:
            f = re.search(rf"(?:^|\s){re.escape(flag)}[= ]({value})", text)
            if f:
                try:
                    out.setdefault(name, conv(f.group(1)))
                except ValueError:
                    pass
    return out


def strip_outer(raw: str) -> str:
    """A line without colours, a k9s frame, a shipper's prefix or a JSON wrapper: the engine's own
    line, its worker prefix (`(VllmWorker rank=1 pid=..)`) still in front."""
    text = raw.rstrip("\r\n")
    if "[" in text:
        text = _BARE_SGR.sub("", _ANSI.sub("", text))
    if "\u2502" in text:
        text = _FRAME_END.sub("", text)
    if text[:1] not in _ENGINE_FIRST:  # engine lines start with a level, a name or a paren
        for pat in _OUTER_PREFIXES:
            text = pat.sub("", text, count=1)
    if text.startswith("{") and '"message"' in text:  # JSON log lines (TGI --json-output, llama-server)
        text = _json_message(text)
    return text


def split_prefix(raw: str) -> tuple[str | None, str]:
    """Separate a worker prefix from the message: ('rank=1', 'INFO ... Available KV ...')."""
    text = strip_outer(raw)
    m = _PAREN_PREFIX.match(text)
    if m:
        who, args = m.group("who"), m.group("args")
        rest = text[m.end() :]
        if who.startswith(_ENGINE_LEVEL):
            return None, rest
        r = re.search(r"rank=(\d+)", args) or re.search(r"\bTP(\d+)", args) or re.search(r"_TP(\d+)$", who)
        if r:
            return f"rank={r.group(1)}", rest
        p = re.search(r"pid=(\d+)", args)
        if p:
            return f"pid={p.group(1)}", rest
        return None, rest
    m = _BRACKET_PREFIX.match(text)
    if m:
        inside = m.group("inside")
        r = re.search(r"\bTP(\d+)", inside) or re.search(r"gpu_id=(\d+)", inside)
        return (f"rank={r.group(1)}" if r else None), text[m.end() :]
    return None, text


def _json_message(text: str) -> str:
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return text
    if not isinstance(data, dict) or not isinstance(data.get("message"), str):
        return text
    # A log line's other fields (target, filename) can carry engine markers: keep them after it.
    rest = " ".join(
        f"{k}={v}" for k, v in data.items() if k not in ("message", "timestamp") and isinstance(v, str)
    )
    return f"{data['message']} {rest}".strip()


# None: the line matched the pattern but carries nothing (skipped, as parse_lines already does)
Extract = Callable[[re.Match[str]], dict[str, Any] | None]


@dataclass(frozen=True)
class Rule:
    """One kind of log line and what it tells.

    `starts`: the line opens a new start-up (a version banner, the engine's arguments).
    `once`: the line is printed once per worker per start-up, so seeing it again for the same
    worker means the engine started again. `shared`: the figure is engine-wide, not per rank.
    `accumulate`: figures of repeated lines add up (llama.cpp prints one KV buffer per cache).
    `generic`: the line is not the engine's own wording (a pasted command's continuation line,
    nvidia-smi's table): it is read, but does not tell which engine wrote the log.
    """

    name: str
    pattern: re.Pattern[str]
    extract: Extract
    starts: bool = False
    once: bool = False
    shared: bool = False
    accumulate: bool = False
    generic: bool = False
    key: str | None = None  # literal text every matching line contains (see required_literal)


def rule(name: str, pattern: str, extract: Extract, **flags: bool) -> Rule:
    return Rule(name, re.compile(pattern), extract, key=required_literal(pattern), **flags)


@dataclass
class _Group:
    fields: dict[str, Any] = field(default_factory=dict)
    lines: list[tuple[int, str]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def put(self, values: dict[str, Any], accumulate: bool) -> None:
        for k, v in values.items():
            if v is None:
                continue
            # Only byte figures add up; counts (cells, seqs) of a repeated line are the same thing.
            if accumulate and k.endswith("_bytes") and isinstance(self.fields.get(k), int):
                self.fields[k] += v
            elif isinstance(v, dict) and isinstance(self.fields.get(k), dict):
                for inner, value in v.items():  # a table read line by line (llama.cpp's hyperparameters)
                    self.fields[k].setdefault(inner, value)
            else:
                self.fields.setdefault(k, v)  # the first (most precise, earliest) value wins


@dataclass
class StartUp:
    """What one engine start-up printed: engine-wide fields and fields per worker rank."""

    shared: _Group = field(default_factory=_Group)
    ranks: dict[str | None, _Group] = field(default_factory=dict)

    def has_memory(self) -> bool:
        groups = [self.shared, *self.ranks.values()]
        return any(k in g.fields for g in groups for k in MEMORY_FIELDS)

    def has_figures(self) -> bool:
        """Memory the start-up allocated, host buffers included: a CPU-only start-up prints no GPU
        memory line, and a second start-up after it must still open a start-up of its own. (Free
        memory and a fit projection, printed before loading, are not allocations.)"""
        groups = [self.shared, *self.ranks.values()]
        return any(k in g.fields for g in groups for k in (*MEMORY_FIELDS, *HOST_FIELDS))

    def per_rank(self) -> list[tuple[int | None, dict[str, Any], list[tuple[int, str]]]]:
        """(rank, fields, lines) per worker that printed memory figures; shared fields merged."""
        keys = [k for k, g in self.ranks.items() if any(not f.startswith("settings.") for f in g.fields)]
        if not keys:
            keys = [None] if None in self.ranks else []
        if not keys:
            return [(None, dict(self.shared.fields), list(self.shared.lines))]
        out = []
        numbered = _rank_numbers(keys)
        for key in keys:
            g = self.ranks[key]
            merged = dict(self.shared.fields) | g.fields
            lines = sorted(set(self.shared.lines) | set(g.lines))
            out.append((numbered[key] if len(keys) > 1 or key is not None else None, merged, lines))
        return sorted(out, key=lambda t: -1 if t[0] is None else t[0])


def _rank_numbers(keys: list[str | None]) -> dict[str | None, int]:
    """rank=N keeps N; a worker named only by pid gets the next free number in order of
    appearance; the unprefixed driver (V0 prints rank 0 without a prefix) is rank 0."""
    taken = {int(k.split("=")[1]) for k in keys if k and k.startswith("rank=")}
    out: dict[str | None, int] = {}
    nxt = 0
    for k in keys:
        if k and k.startswith("rank="):
            out[k] = int(k.split("=")[1])
            continue
        while nxt in taken:
            nxt += 1
        out[k] = nxt
        taken.add(nxt)
    return out


def iter_lines(source: Iterable[str]) -> Iterable[Line]:
    for i, raw in enumerate(source, start=1):
        if not raw:
            continue  # nothing to read (and the lines a long log's prefilter blanked)
        raw = raw.rstrip("\r\n")
        if len(raw) > MAX_LINE_CHARS:  # a binary blob or a pasted tensor: read its start only
            raw = raw[:MAX_LINE_CHARS]
        key, msg = split_prefix(raw)
        yield Line(i, raw, msg, key)


def _sre() -> tuple[Any, Any]:
    try:  # Python 3.11+
        from re import _constants as c  # type: ignore[attr-defined]
        from re import _parser as sp  # type: ignore[attr-defined]
    except ImportError:  # Python 3.10 (declared in pyproject)
        import sre_constants as c
        import sre_parse as sp
    return c, sp


def _longest_literal(seq: Any, c: Any) -> str:
    """The longest run of literal text every match of the parsed sequence contains."""
    best = ""
    run: list[str] = []

    def flush() -> None:
        nonlocal best
        text = "".join(run)
        if len(text) > len(best):
            best = text
        run.clear()

    def walk(items: Any) -> None:
        for op, av in items:
            if op is c.LITERAL:
                run.append(chr(av))
            elif op is c.SUBPATTERN and av[3] is not None:
                walk(av[3])  # a plain group: its content is required too
            else:
                flush()  # alternatives, repeats, classes: nothing certain beyond this point

    walk(seq)
    flush()
    return best


def required_literal(pattern: str) -> str | None:
    """The longest run of literal text every match of `pattern` contains (4+ characters), or
    None. A line without it cannot match, so a long log's ordinary lines (request logs,
    progress bars) are passed over with a substring test instead of a regex search per rule."""
    c, sp = _sre()
    try:
        best = _longest_literal(sp.parse(pattern), c)
    except Exception:  # an unusual pattern simply gets no shortcut
        return None
    return best if len(best) >= 4 else None


def literal_hints(pattern: str) -> list[str] | None:
    """Literals (4+ characters) one of which every match of `pattern` contains, or None: the
    required literal, else one per alternative of an alternation the pattern cannot skip
    (`failed to create context|unable to create llama context` -> both)."""
    c, sp = _sre()

    def hints(seq: Any) -> list[str] | None:
        best = _longest_literal(seq, c)
        if len(best) >= 4:
            return [best]
        for op, av in seq:
            if op is c.SUBPATTERN and av[3] is not None and len(av[3]) == 1:
                op, av = av[3][0]  # (?:a|b): the alternation inside
            if op is c.BRANCH:
                found = [hints(b) for b in av[1]]
                if all(f is not None for f in found):
                    return [h for f in found for h in f]  # type: ignore[union-attr]
        return None

    try:
        return hints(sp.parse(pattern))
    except Exception:
        return None


_SHORTCUTS: dict[int, tuple[list[Rule], list[Rule], re.Pattern[str] | None]] = {}


def candidates(rules: list[Rule], message: str) -> list[Rule]:
    """The rules that can match this line (their required literal is in it, or they have none)."""
    cut = _SHORTCUTS.get(id(rules))
    if cut is None or cut[0] is not rules:
        keys = sorted({r.key for r in rules if r.key}, key=len, reverse=True)
        cut = (
            rules,
            [r for r in rules if r.key is None],
            re.compile("|".join(re.escape(k) for k in keys)) if keys else None,
        )
        _SHORTCUTS[id(rules)] = cut
    _, keyless, any_key = cut
    if any_key is None or not any_key.search(message):
        return keyless  # most lines of a long log: none of the rules' words is there
    return [r for r in rules if r.key is None or r.key in message]


def parse_lines(source: Iterable[str], rules: list[Rule]) -> tuple[list[StartUp], int]:
    """Run the rules over a log. Returns the start-ups found and how many lines matched."""
    startups: list[StartUp] = [StartUp()]
    matched = 0
    for line in iter_lines(source):
        hits: list[tuple[Rule, dict[str, Any]]] = []
        for r in candidates(rules, line.message):
            m = r.pattern.search(line.message)
            if not m:
                continue
            try:
                values = r.extract(m)
            except (ValueError, KeyError, IndexError, OverflowError):
                continue  # garbled numbers: skip the line, keep going
            if values is not None:
                hits.append((r, values))
        if not hits:
            continue
        matched += 1
        cur = startups[-1]
        key = line.rank_key
        for r, values in hits:
            values = dict(values)
            rk = values.pop("_rank", key)
            if r.starts and cur.has_figures():
                cur = StartUp()
                startups.append(cur)
            group = cur.shared if r.shared else cur.ranks.setdefault(rk, _Group())
            if r.once and r.name in group.seen:
                cur = StartUp()
                startups.append(cur)
                group = cur.shared if r.shared else cur.ranks.setdefault(rk, _Group())
            group.seen.add(r.name)
            group.put(values, r.accumulate)
            if (line.number, line.raw) not in group.lines:
                group.lines.append((line.number, line.raw))
    return [s for s in startups if s.shared.fields or s.ranks], matched


def assemble(
    engine: str,
    startups: list[StartUp],
    finish: Callable[[dict[str, Any]], None] | None = None,
) -> list[Any]:
    """Turn start-ups into `Observation`s (one per rank), complete ones flagged as such.

    `finish` lets an engine derive what its log implies (SGLang weights from two 'avail mem'
    figures, TGI tokens from blocks) on the merged fields before they are validated.
    """
    from vramlab.logs.observation import SETTINGS_KEYS, Observation, SourceLine

    out = []
    for index, su in enumerate(startups):
        for rank, fields, lines in su.per_rank():
            fields = dict(fields)
            if finish is not None:
                finish(fields)
            settings = {k.split(".", 1)[1]: fields.pop(k) for k in list(fields) if k.startswith("settings.")}
            extra = {k.split(".", 1)[1]: fields.pop(k) for k in list(fields) if k.startswith("extra.")}
            settings = {k: v for k, v in settings.items() if k in SETTINGS_KEYS}
            if "max_model_len" not in fields and settings.get("max_model_len") is not None:
                fields["max_model_len"] = settings["max_model_len"]
            if "gpu_memory_utilization" not in fields and settings.get("gpu_memory_utilization") is not None:
                fields["gpu_memory_utilization"] = settings["gpu_memory_utilization"]
            if fields.get("engine_version"):
                settings.setdefault("engine_version", fields["engine_version"])
            known = {k: v for k, v in fields.items() if k in Observation.model_fields}
            if (
                not su.has_memory()
                and all(known.get(k) is None for k in MEMORY_FIELDS)
                and not known.get("max_model_len")
                and not known.get("model")
            ):
                continue  # a version banner alone is not worth reporting
            obs = Observation(
                startup=index,
                engine=engine,
                rank=rank,
                settings=settings,
                extra=extra,
                source_lines=[SourceLine(line=n, text=t) for n, t in lines],
                complete=any(known.get(k) is not None for k in COMPLETE_FIELDS),
                **known,
            )
            out.append(obs)
    return out


def one_line_blocks(
    lines: Iterable[str],
    starts: Callable[[str], bool],
    ends: Callable[[str], bool],
    max_lines: int,
    join: Callable[[list[str]], str] = " ".join,
) -> Iterable[str]:
    """Each multi-line block a rule reads as one line (a pretty-printed TGI `Args {`, a transformers config
    dump): the block joined by `join`, then empty lines in place of the ones it took, so every later line
    keeps its number. A block ends at `ends(line)` or after `max_lines` (a missing end must not swallow the log)."""
    block: list[str] | None = None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if block is not None:
            block.append(line.strip())
            if ends(line) or len(block) > max_lines:
                yield join(block)
                yield from [""] * (len(block) - 1)
                block = None
            continue
        if starts(line):
            block = [line.rstrip()]
            continue
        yield line
    if block is not None:
        yield join(block)
        yield from [""] * (len(block) - 1)
