"""Pick the engine a log came from and parse it: the one entry point callers need.

    result = parse_log(path_or_lines)           # engine detected
    result = parse_log(lines, engine="sglang")  # engine given
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from vramlab.errors import ConfigError, unknown
from vramlab.logs import llamacpp, ollama, sglang, tgi, vllm
from vramlab.logs.base import iter_lines

PARSERS: dict[str, ModuleType] = {"vllm": vllm, "sglang": sglang, "tgi": tgi, "llama.cpp": llamacpp, "ollama": ollama}
ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "text-generation-inference": "tgi"}

# Words that name an engine even on lines no rule reads (a log that stops early).
_MARKERS: dict[str, tuple[str, ...]] = {
    "vllm": ("vLLM", "vllm", "gpu_worker.py", "gpu_model_runner", "EngineCore", "VllmWorker"),
    "sglang": ("sglang", "ServerArgs(", "Load weight begin", "KV Cache is allocated", "max_total_num_tokens"),
    "tgi": ("text_generation_launcher", "text_generation_router", "text_generation_server", "KV-cache blocks"),
    "llama.cpp": ("llama_model_loader", "load_tensors:", "ggml_cuda_init", "llama_context", "llama_kv_cache"),
    "ollama": ("source=server.go", "source=sched.go", "source=memory.go", "source=routes.go", "ollama"),
}


@dataclass
class ParsedLog:
    engine: str
    observations: list[Any]  # complete start-ups, one Observation per rank
    incomplete: list[Any] = field(default_factory=list)  # start-ups the log cut short
    lines: int = 0
    source: str | None = None


def engine_name(name: str) -> str:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in PARSERS:
        raise unknown("engine", name, list(PARSERS))
    return key


def detect_engine(lines: list[str]) -> str | None:
    """The engine whose rules read the most lines; markers break ties and cover short logs."""
    scores: dict[str, tuple[int, int]] = {}
    messages = [ln.message for ln in iter_lines(lines)]
    for name, module in PARSERS.items():
        rules = module.OWN_RULES if hasattr(module, "OWN_RULES") else module.RULES
        hits = sum(1 for msg in messages if any(r.pattern.search(msg) for r in rules))
        marks = sum(1 for msg in messages[:5000] if any(mk in msg for mk in _MARKERS[name]))
        scores[name] = (hits, marks)
    # Ollama embeds llama-server's lines: any Ollama-only line decides for Ollama.
    if scores["ollama"][0] > 0 or (scores["ollama"][1] > 0 and scores["llama.cpp"][0] > 0):
        return "ollama"
    best = max(scores, key=lambda n: scores[n])
    return best if scores[best] != (0, 0) else None


def read_log(path: str | Path) -> list[str]:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    # Logs are UTF-8 in practice; a stray byte must not stop the parse.
    return data.decode("utf-8", errors="replace").splitlines()


def parse_log(source: str | Path | Iterable[str], engine: str | None = None) -> ParsedLog:
    """Parse a log file (path) or its lines. Raises ConfigError when nothing is recognizable."""
    label = None
    if isinstance(source, (str, Path)):
        label = str(source)
        lines = read_log(source)
    else:
        lines = list(source)
    name = engine_name(engine) if engine else detect_engine(lines)
    if name is None:
        raise ConfigError(f"{label or 'log'}: no line of a known engine (vllm, sglang, tgi, llama.cpp, ollama) found")
    found = PARSERS[name].parse(lines)
    if label:
        found = [o.model_copy(update={"source": label}) for o in found]
    complete = [o for o in found if o.complete]
    incomplete = [o for o in found if not o.complete]
    if not found:
        from vramlab.logs.signatures import scan

        failures = scan(lines, None if name == "ollama" else name)
        why = (f"; it shows a failure: {failures[0].kind} ({failures[0].name}) at line {failures[0].line_number}"
               if failures else " (the engine prints them while it loads the model; see docs/logs-and-calibration.md)")
        raise ConfigError(f"{label or 'log'}: looks like {name}, but no start-up memory line was found{why}")
    return ParsedLog(name, complete, incomplete, len(lines), label)
