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
from vramlab.logs.prefilter import blank_unread_lines
from vramlab.logs.reader import LogLines, read_log, read_notes

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


def engine_scores(lines: list[str]) -> dict[str, tuple[int, int]]:
    """Per engine: (lines its own rules read, lines of the head that carry one of its marker words).
    Generic rules (a command's continuation lines, nvidia-smi's table) name no engine and do not count."""
    from vramlab.logs.base import candidates

    scores: dict[str, tuple[int, int]] = {}
    messages = [ln.message for ln in iter_lines(lines)]
    for name, module in PARSERS.items():
        rules = [r for r in getattr(module, "OWN_RULES", module.RULES) if not r.generic]
        hits = sum(1 for msg in messages if any(r.pattern.search(msg) for r in candidates(rules, msg)))
        marks = sum(1 for msg in messages[:5000] if any(mk in msg for mk in _MARKERS[name]))
        scores[name] = (hits, marks)
    return scores


def detect_engine(lines: list[str], scores: dict[str, tuple[int, int]] | None = None) -> str | None:
    """The engine whose rules read the most lines; markers break ties and cover short logs."""
    scores = scores or engine_scores(lines)
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
        lines: list[str] = read
    elif getattr(source, "prefiltered", False):
        lines = source  # type: ignore[assignment]  # read_log blanked what no rule reads
    else:
        lines = list(source)
        blank_unread_lines(lines)  # a copy: the caller's lines stay whole
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


__all__ = [
    "ALIASES",
    "PARSERS",
    "LogLines",
    "ParsedLog",
    "detect_engine",
    "engine_scores",
    "diff_sides",
    "engine_name",
    "parse_log",
    "read_log",
    "read_notes",
]
