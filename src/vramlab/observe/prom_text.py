"""Scrape an engine's Prometheus ``/metrics`` and map its names onto one vocabulary.

Engines name the same signal differently, and vLLM renamed some between versions
(``vllm:gpu_cache_usage_perc`` became ``vllm:kv_cache_usage_perc``; counters appear with or without
``_total``). Each canonical name lists the spellings it accepts, first match wins per scrape.
Sources: vLLM's design/metrics.md doc, SGLang production_metrics.md, TGI reference/metrics.md,
llama.cpp tools/server/README.md (see docs/experiments.md).

A scrape is bounded (vramlab.observe.http): the first `MAX_BODY_BYTES` of the exposition are read,
and of those the first `MAX_SERIES` sample lines; only the lines of the names above are parsed,
off the event loop when the body is large. An exposition past either bound is read in part and the
sampler says so once (`notes`). NaN and ±Inf are legal sample values: they are parsed as such, and
the sampler set leaves them out of the store, saying so (vramlab.observe.base).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from vramlab.engines import ENGINES
from vramlab.observe import http
from vramlab.observe.base import Sample, Sampler, SourceUnavailable

MAX_BODY_BYTES = 4 * http.MIB  # vLLM's /metrics for one model is ~100 KiB; histograms for many, a few MiB
MAX_SERIES = 20_000  # lines looked at per scrape

# canonical -> (spellings, how to combine label sets). Percentages are fractions 0..1 in every engine
# listed. Each engine's spellings are the engine registry's (vramlab.engines), in its order.
_HOW = {
    "kv_cache_usage_perc": "max",
    "kv_cache_pool_tokens": "max",
    "prefix_cache_hit_rate": "max",
}  # the rest add up ("sum")


def _aliases() -> dict[str, tuple[tuple[str, ...], str]]:
    spellings: dict[str, list[str]] = {}
    for engine in ENGINES.values():
        for canon, names in engine.metrics.items():
            spellings.setdefault(canon, []).extend(names)
    spellings["process_resident_memory_bytes"] = ["process_resident_memory_bytes"]  # any Python server
    return {canon: (tuple(names), _HOW.get(canon, "sum")) for canon, names in spellings.items()}


ALIASES = _aliases()
# vLLM's `cache_config_info` is an info gauge: the pool is in its labels (num_gpu_blocks x block_size).
_INFO_LABELS = {
    "vllm:cache_config_info": (("num_gpu_blocks", "kv_cache_blocks"), ("block_size", "kv_block_size"))
}


def _base(name: str) -> str:
    # Counters are exposed as NAME_total; families may be declared with or without it.
    return name[:-6] if name.endswith("_total") else name


_LOOKUP: dict[str, str] = {}
for _canon, (_names, _how) in ALIASES.items():
    for _n in _names:
        _LOOKUP.setdefault(_base(_n), _canon)


# A line that starts with a name vramlab reads (any suffix: the parse below sorts them out), and the
# first MAX_SERIES lines: each found by one regex pass in C (the newline first, so the search jumps
# from line to line), so a scrape of a few MiB holds the interpreter for milliseconds, not a loop.
_KNOWN_LINE = re.compile(
    r"\n(?:"
    + "|".join(re.escape(n) for n in sorted({*_LOOKUP, *_INFO_LABELS}, key=len, reverse=True))
    + r")[^\n]*"
)
_HEAD = re.compile(rf"(?:[^\n]*\n){{0,{MAX_SERIES}}}")


def known_lines(text: str) -> tuple[str, bool]:
    """The lines of the names vramlab reads among the first MAX_SERIES lines, and whether the text
    had more lines than that."""
    match = _HEAD.match(text)
    end = match.end() if match is not None else 0
    head = "\n" + text[:end] if end else "\n" + text
    more = bool(end) and bool(text[end:].strip())
    return "".join(m.group(0) for m in _KNOWN_LINE.finditer(head)) + "\n", more


def parse_metrics(text: str, t: float | None = None, source: str = "engine") -> list[Sample]:
    """Canonical samples from a Prometheus text exposition; unknown names are ignored."""
    from prometheus_client.parser import text_string_to_metric_families

    now = time.perf_counter() if t is None else t
    text, _ = known_lines(text)
    found: dict[str, dict[str, list[float]]] = {}  # canonical -> spelling -> values
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                for label, canon_name in _INFO_LABELS.get(s.name, ()):
                    try:
                        found.setdefault(canon_name, {}).setdefault(s.name, []).append(float(s.labels[label]))
                    except (KeyError, ValueError):  # "None" before the engine sized its pool
                        pass
                if (
                    s.name.endswith(("_created", "_bucket", "_count", "_sum"))
                    and _base(s.name) not in _LOOKUP
                ):
                    continue
                canon = _LOOKUP.get(_base(s.name))
                if canon is not None:
                    found.setdefault(canon, {}).setdefault(_base(s.name), []).append(float(s.value))
    except ValueError as exc:
        raise ValueError(f"not Prometheus text: {exc}") from None
    out = []
    for canon, by_name in found.items():
        if canon not in ALIASES:  # from an info gauge's labels
            ((spelling, vals),) = by_name.items()
            out.append(Sample(source, f"engine.{canon}", max(vals), now, {"metric": spelling}))
            continue
        names, how = ALIASES[canon]
        spelling = next(_base(n) for n in names if _base(n) in by_name)  # the preferred spelling present
        vals = by_name[spelling]
        # NaN anywhere makes the whole reading NaN (max() would depend on the order): not stored, said so
        value = math.nan if any(v != v for v in vals) else max(vals) if how == "max" else sum(vals)
        out.append(Sample(source, f"engine.{canon}", value, now, {"metric": spelling}))
    return out


class PromTextSampler(Sampler):
    source = "engine"

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._session: Any = None
        self.notes: list[str] = []
        self._said: set[str] = set()

    async def open(self) -> None:
        self._session = http.session(self.timeout_s)
        try:
            samples = await self.sample()
        except Exception as exc:
            await self.close()
            raise SourceUnavailable(f"{self.url}: {type(exc).__name__}: {exc}"[:200]) from None
        if not samples:
            await self.close()
            raise SourceUnavailable(f"{self.url}: no metric vramlab knows (vLLM, SGLang, TGI, llama.cpp)")

    async def sample(self) -> list[Sample]:
        answer = await http.get(self._session, self.url, MAX_BODY_BYTES, partial=True)
        if answer.status != 200:
            raise ValueError(f"HTTP {answer.status}")
        if answer.truncated:
            self._say(f"{self.url} is larger than {MAX_BODY_BYTES >> 20} MiB: only its first part is read")
        samples, more = await http.parse_off_loop(self._parse, answer.body)
        if more:
            self._say(
                f"{self.url} has more than {MAX_SERIES:,} lines: only the first {MAX_SERIES:,} are read"
            )
        return samples

    @staticmethod
    def _parse(body: bytes) -> tuple[list[Sample], bool]:
        text = body.decode("utf-8", "replace")
        if "\n" in text and not text.endswith("\n"):  # a cut body: its last line may be half a line
            text = text[: text.rindex("\n") + 1]
        lines, more = known_lines(text)
        return parse_metrics(lines), more

    def _say(self, note: str) -> None:
        if note not in self._said:  # once per run: the sampler set hands notes to the run
            self._said.add(note)
            self.notes.append(f"sampler engine: {note}")

    def take_notes(self) -> list[str]:
        out, self.notes = self.notes, []
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
