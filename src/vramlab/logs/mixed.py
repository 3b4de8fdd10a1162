"""Several engines in one stream: each engine's lines read as its own log.

A file can hold a vLLM start-up, then an Ollama server, then a llama-server, with no prefix that
names a writer (`cat a.log b.log`, one terminal's scrollback, a shared `server.log`). An engine's
parser reads only the lines its rules match, so each engine present is read over the whole stream
and keeps the file's line numbers; the start-ups of the others are never summed into it.

One pair needs telling apart: Ollama runs llama.cpp, and its log carries llama.cpp's own lines
(the runner's `llama_model_loader`, `load_tensors`, KV and compute buffers). Those lines belong to
a standalone llama.cpp only after a llama.cpp program start (`build: N (hash)`, a pasted
`llama-server` command) that is not the runner Ollama just started (`msg="starting llama server"`
or `"starting runner"` without `--ollama-engine`, until Ollama says it is up or the runner has
sized its KV cache); from the next Ollama line on they are Ollama's again.

Pure: lines in, (engine, lines) parts out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vramlab.logs.base import candidates, iter_lines

_OLLAMA_LINE = re.compile(r"\blevel=[A-Z]+ source=\S+\.go:\d+|^\[GIN\]")
_RUNNER_START = re.compile(r'msg="starting (?:llama server|runner)"')
_RUNNER_UP = re.compile(
    r'msg="(?:llama runner started|model weights|kv cache|compute graph|total memory|offload to \w+)|msg=offload\b'
)
_LLAMA_STARTS = ("build", "command")
_LLAMA_KV = ("kv_buffer", "kv_summary")


@dataclass(frozen=True)
class Part:
    engine: str
    lines: list[str]  # the stream's lines; another engine's section blanked where the two share rules
    own_lines: int  # lines this engine's own rules read


def engine_parts(lines: list[str], primary: str, scores: dict[str, tuple[int, int]]) -> list[Part]:
    """The primary engine's part first, then one per other engine whose own rules read a line
    (*scores*: logs/detect.py `engine_scores`)."""
    counts = {name: hits for name, (hits, _) in scores.items()}
    others = [e for e, n in counts.items() if e != primary and n]
    if "ollama" in (primary, *others) and "llama.cpp" in (primary, *others):
        standalone = _standalone_llamacpp(lines)
        if not standalone:  # every llama.cpp line is Ollama's runner's
            others = [e for e in others if e != "llama.cpp"]
            primary = "ollama" if primary == "llama.cpp" else primary
            return [Part(primary, lines, counts[primary])] + [Part(e, lines, counts[e]) for e in others]
        views = {
            "llama.cpp": [ln if own else "" for ln, own in zip(lines, standalone, strict=True)],
            "ollama": [ln if not own else "" for ln, own in zip(lines, standalone, strict=True)],
        }
        parts = [primary, *others]
        return [Part(e, views.get(e, lines), counts[e]) for e in parts]
    return [Part(primary, lines, counts[primary])] + [Part(e, lines, counts[e]) for e in others]


def _standalone_llamacpp(lines: list[str]) -> list[bool]:
    """Per line: whether it lies in a standalone llama.cpp's section of an Ollama log (all False
    when there is none)."""
    from vramlab.logs import llamacpp

    starts = [r for r in llamacpp.RULES if r.name in _LLAMA_STARTS]
    kv = [r for r in llamacpp.RULES if r.name in _LLAMA_KV]
    owner: list[bool] = [False] * len(lines)
    state, pending = "", False
    for ln in iter_lines(lines):
        msg = ln.message
        if _OLLAMA_LINE.search(msg):
            state = "ollama"
            if _RUNNER_START.search(msg):
                pending = "--ollama-engine" not in msg
            elif _RUNNER_UP.search(msg):
                pending = False
        elif not pending and any(r.pattern.search(msg) for r in candidates(starts, msg)):
            state = "llama.cpp"
        elif state == "ollama" and any(r.pattern.search(msg) for r in candidates(kv, msg)):
            pending = False  # the runner sized its KV cache: a later `build:` is another program
        owner[ln.number - 1] = state == "llama.cpp"
    return owner if any(owner) else []


__all__ = ["Part", "engine_parts"]
