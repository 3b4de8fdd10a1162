"""Pick the engine a log came from and parse it: the one entry point callers need.

    result = parse_log(path_or_lines)           # engine detected
    result = parse_log(lines, engine="sglang")  # engine given
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from vramlab.errors import ConfigError, unknown
from vramlab.logs import llamacpp, ollama, sglang, tgi, transformers, vllm
from vramlab.logs.base import iter_lines

PARSERS: dict[str, ModuleType] = {"vllm": vllm, "sglang": sglang, "tgi": tgi, "llama.cpp": llamacpp, "ollama": ollama,
                                 "transformers": transformers}
ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "text-generation-inference": "tgi",
           "transformers-serve": "transformers", "hf-transformers": "transformers"}

# Words that name an engine even on lines no rule reads (a log that stops early).
_MARKERS: dict[str, tuple[str, ...]] = {
    "vllm": ("vLLM", "vllm", "gpu_worker.py", "gpu_model_runner", "EngineCore", "VllmWorker"),
    "sglang": ("sglang", "ServerArgs(", "Load weight begin", "KV Cache is allocated", "max_total_num_tokens"),
    "tgi": ("text_generation_launcher", "text_generation_router", "text_generation_server", "KV-cache blocks"),
    "llama.cpp": ("llama_model_loader", "load_tensors:", "ggml_cuda_init", "llama_context", "llama_kv_cache",
                  "llama_new_context_with_model", "llama_init_from_model", "print_info:", "llama-server"),
    "ollama": ("source=server.go", "source=sched.go", "source=memory.go", "source=routes.go", "ollama", "[GIN]"),
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
        began = [(min(s.line for s in o.source_lines), o) for o in self.observations + self.incomplete
                 if o.source_lines and min(s.line for s in o.source_lines) <= failure.line_number]
        if not began:
            return "start-up"
        owner = max(began, key=lambda t: t[0])[1]
        # up: its KV decision printed, or (transformers serve, which sizes no pool) its server listening
        up = owner.complete or owner.extra.get("listen") is not None
        return "serving" if up and max(s.line for s in owner.source_lines) < failure.line_number else "start-up"


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


def read_log(path: str | Path, max_bytes: int | None = None, max_line: int | None = None) -> list[str]:
    """The lines of a log, read as a stream with bounds: a line longer than `max_line`
    characters keeps its start only and reading stops after `max_bytes` bytes, so
    `/dev/zero`, a FIFO that never ends or a multi-GB file cost bounded time and memory.
    `read_log.truncated` (on the returned list) says whether the cap was hit."""
    from vramlab.logs.base import MAX_LINE_CHARS, MAX_LOG_BYTES

    cap = MAX_LOG_BYTES if max_bytes is None else max_bytes
    width = MAX_LINE_CHARS if max_line is None else max_line
    p = Path(path)
    if str(path) != "-" and p.is_dir():
        raise ConfigError(f"{p}: is a folder; pass the folder to read every log in it")
    lines = _Lines()
    try:
        with (_stdin() if str(path) == "-" else open(p, "rb")) as fh:
            total = 0
            while total < cap:
                chunk = fh.readline(min(width, cap - total) + 1)
                if not chunk:
                    break
                total += len(chunk)
                if not chunk.endswith(b"\n") and len(chunk) > width:
                    # An over-long line: keep its start, skip the rest up to the next newline.
                    while total < cap:
                        rest = fh.readline(min(1 << 16, cap - total))
                        if not rest:
                            break
                        total += len(rest)
                        if rest.endswith(b"\n"):
                            break
                    chunk = chunk[:width]
                # Logs are UTF-8 in practice; a stray byte must not stop the parse.
                lines.append(chunk.decode("utf-8", errors="replace").rstrip("\r\n"))
            lines.truncated = total >= cap
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    return lines


def _stdin() -> Any:
    """Standard input as bytes, left open for the caller (`kubectl logs pod | check-log -`)."""
    import contextlib
    import sys

    return contextlib.nullcontext(sys.stdin.buffer)


class _Lines(list):  # type: ignore[type-arg]
    truncated = False


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


def parse_log(source: str | Path | Iterable[str], engine: str | None = None,
              max_bytes: int | None = None, label: str | None = None) -> ParsedLog:
    """Parse a log file (path) or its lines. Never needs the model, the GPU or the version.

    Raises ConfigError only when nothing in it is recognizable: no memory line, no setting
    and no failure of a known engine."""
    from vramlab.logs.signatures import scan

    notes: list[str] = []
    if isinstance(source, (str, Path)):
        label = label or str(source)
        lines = read_log(source, max_bytes)
        if getattr(lines, "truncated", False):
            from vramlab.logs.base import MAX_LOG_BYTES

            cap = MAX_LOG_BYTES if max_bytes is None else max_bytes
            notes.append(f"read the first {cap:,} bytes only (the rest of the log was not read; see --max-bytes)")
    else:
        lines = list(source)
    name = engine_name(engine) if engine else detect_engine(lines)
    if name is None:
        raise ConfigError(f"{label or 'log'}: no line of a known engine ({', '.join(PARSERS)}) found")
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
        raise ConfigError(f"{label or 'log'}: looks like {name}, but no start-up memory line, setting or failure was "
                          "found (the engine prints them while it loads the model; see docs/logs-and-calibration.md)")
    return ParsedLog(name, complete, incomplete, len(lines), label, failures, notes)
