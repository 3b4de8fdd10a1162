"""Request traces: when each request came, how long its prompt and its answer were, and which
prompt blocks it shared with others. Three formats, each as its project publishes it:

- ``mooncake``: one JSON object a line, ``timestamp`` (ms since the trace's first request),
  ``input_length`` and ``output_length`` (tokens), ``hash_ids`` (one id per 512-token block of the
  prompt, the last one possibly partial; two requests with the same ids in front share that
  prefix), as in kvcache-ai/Mooncake's FAST'25 traces and the loaders of AIPerf
  (its trace-replay page, benchmark_modes/trace_replay.md) and NVIDIA Dynamo's data generator;
- ``burstgpt``: BurstGPT's CSV (HPMLL/BurstGPT, README "Schema"): ``Timestamp`` (seconds from the
  trace's start), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``;
  no prefix information (every prompt is its own);
- ``jsonl``: vramlab's own (the shape `vramlab pack --simulate` reads): ``t_s``, ``prompt_tokens``,
  ``output_tokens``, and optionally ``model``, ``hash_ids`` (as Mooncake's) or ``prompt`` (a text
  sent as it is).

Times are made relative to the first request and multiplied by ``time_scale`` (0.5 replays the
trace in half its time, at twice its rate); ``max_requests`` keeps the first N requests.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vramlab.errors import ConfigError
from vramlab.load.prompts import CountFailed, Prompt, PromptMaker

TraceFormat = Literal["mooncake", "burstgpt", "jsonl"]
FORMATS: tuple[TraceFormat, ...] = ("mooncake", "burstgpt", "jsonl")
MOONCAKE_BLOCK_TOKENS = 512  # one hash id stands for this many prompt tokens (Mooncake's traces)
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
MAX_TOKENS_PER_REQUEST = 10_000_000


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace, its time already relative to the first and scaled."""

    t_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # Mooncake's prompt blocks; () = a prompt of its own
    model: str | None = None
    text: str | None = None  # a jsonl trace's own prompt text, sent as it is


def read_trace(
    path: str | Path, fmt: TraceFormat, time_scale: float = 1.0, max_requests: int | None = None
) -> list[TraceRequest]:
    """The trace in *path*, sorted by time (stable: equal times keep the file's order), first at 0."""
    from vramlab.infile import DATA_BYTES, read_text

    text = read_text(path, "trace", DATA_BYTES, expect=f"a {fmt} trace")
    return parse_trace(text, fmt, time_scale, max_requests, str(path))


def parse_trace(
    text: str,
    fmt: TraceFormat,
    time_scale: float = 1.0,
    max_requests: int | None = None,
    name: str = "trace",
) -> list[TraceRequest]:
    if fmt not in FORMATS:
        raise ConfigError(f"{name}: unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ConfigError(f"{name}: time_scale must be a positive number, got {time_scale}")
    if fmt == "burstgpt":
        rows = _burstgpt(text, name)
    else:
        rows = _jsonl_rows(text, name, fmt)
    if not rows:
        raise ConfigError(f"{name}: the trace has no requests")
    rows.sort(key=lambda r: r[0])  # list.sort is stable: simultaneous requests keep their order
    if max_requests is not None:
        rows = rows[:max_requests]
    t0 = rows[0][0]
    return [
        TraceRequest((t - t0) * time_scale, n_in, n_out, ids, model, prompt)
        for t, n_in, n_out, ids, model, prompt in rows
    ]


_Row = tuple[float, int, int, tuple[int, ...], str | None, str | None]


def _jsonl_rows(text: str, name: str, fmt: TraceFormat) -> list[_Row]:
    rows: list[_Row] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{name}:{n}: not JSON: {getattr(exc, 'msg', exc)}") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{name}:{n}: each line must be a JSON object")
        where = f"{name}:{n}"
        if fmt == "mooncake":
            t = _number(obj, "timestamp", where) / 1000.0
            n_in = _count(obj, "input_length", where)
            n_out = _count(obj, "output_length", where)
        else:
            t = _number(obj, "t_s", where)
            n_in = _count(obj, "prompt_tokens", where)
            n_out = _count(obj, "output_tokens", where)
        ids = _hash_ids(obj.get("hash_ids"), where, n_in)
        model = obj.get("model")
        prompt = obj.get("prompt") if fmt == "jsonl" else None
        if prompt is not None and (not isinstance(prompt, str) or not prompt):
            raise ConfigError(f"{where}: prompt: must be a non-empty string")
        rows.append((t, n_in, n_out, ids, model if isinstance(model, str) else None, prompt))
    return rows


def _burstgpt(text: str, name: str) -> list[_Row]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise ConfigError(f"{name}: empty file; a BurstGPT trace starts with its header line") from None
    except csv.Error as exc:
        raise ConfigError(f"{name}:1: not CSV: {exc}") from None
    header = [h.strip() for h in header]
    missing = [c for c in ("Timestamp", "Request tokens", "Response tokens") if c not in header]
    if missing:
        raise ConfigError(
            f"{name}:1: not a BurstGPT header (needs {', '.join(BURSTGPT_COLUMNS)}); missing {', '.join(missing)}"
        )
    col = {h: i for i, h in enumerate(header)}
    rows: list[_Row] = []
    try:
        for n, rec in enumerate(reader, 2):
            if not rec or not any(f.strip() for f in rec):
                continue
            if len(rec) < len(header):
                raise ConfigError(f"{name}:{n}: {len(rec)} fields, the header has {len(header)}")
            where = f"{name}:{n}"
            t = _float(rec[col["Timestamp"]], where, "Timestamp")
            n_in = _int(rec[col["Request tokens"]], where, "Request tokens")
            n_out = _int(rec[col["Response tokens"]], where, "Response tokens")
            if not (math.isfinite(t) and t >= 0):
                raise ConfigError(f"{where}: Timestamp: must be a number >= 0, got {t!r}")
            if not 0 < n_in <= MAX_TOKENS_PER_REQUEST:
                raise ConfigError(
                    f"{where}: Request tokens: must be 1 to {MAX_TOKENS_PER_REQUEST:,}, got {n_in}"
                )
            if not 0 <= n_out <= MAX_TOKENS_PER_REQUEST:
                raise ConfigError(
                    f"{where}: Response tokens: must be 0 to {MAX_TOKENS_PER_REQUEST:,}, got {n_out}"
                )
            # BurstGPT_1.csv keeps failed requests with 0 response tokens: replayed as one token
            model = rec[col["Model"]].strip() if "Model" in col else None
            rows.append((t, n_in, max(1, n_out), (), model or None, None))
    except csv.Error as exc:
        raise ConfigError(f"{name}: not CSV: {exc}") from None
    return rows


def _float(cell: str, where: str, field: str) -> float:
    try:
        return float(cell)
    except ValueError:
        raise ConfigError(f"{where}: {field}: not a number: {cell[:40]!r}") from None


def _int(cell: str, where: str, field: str) -> int:
    try:
        return int(cell.strip())
    except ValueError:
        raise ConfigError(f"{where}: {field}: not a whole number: {cell[:40]!r}") from None


def _number(obj: dict[str, Any], key: str, where: str) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"{where}: {key}: must be a number >= 0, got {v!r}")
    return float(v)


def _count(obj: dict[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_TOKENS_PER_REQUEST:
        raise ConfigError(
            f"{where}: {key}: must be a whole number from 1 to {MAX_TOKENS_PER_REQUEST:,}, got {v!r}"
        )
    return v


def _hash_ids(v: Any, where: str, n_in: int) -> tuple[int, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ConfigError(f"{where}: hash_ids: must be a list of whole numbers")
    if len(v) > math.ceil(n_in / MOONCAKE_BLOCK_TOKENS) + 1:
        raise ConfigError(
            f"{where}: hash_ids: {len(v)} blocks of {MOONCAKE_BLOCK_TOKENS} tokens for a prompt of {n_in}"
        )
    return tuple(v)


async def trace_prompts(
    trace: list[TraceRequest], maker: PromptMaker | None = None, seed: int = 0
) -> tuple[list[Prompt], str]:
    """One prompt per request, in the trace's order, and a note on how their tokens were counted.

    A request's prompt is its blocks of MOONCAKE_BLOCK_TOKENS tokens (load/blocks.py), one per hash
    id (the same id: the same text), then blocks of its own for what its ids do not cover; the first
    block gives up what the engine adds around the text (template, BOS), so that every block ends on
    a multiple of MOONCAKE_BLOCK_TOKENS of the engine's count and the whole is the trace's length."""
    from vramlab.load.blocks import ESTIMATE, BlockText, check_counts, join, learn_costs

    counter = maker.counter if maker is not None else None
    added = maker.added_tokens if maker is not None else 0
    costs = ESTIMATE
    if counter is not None:
        try:
            costs = await learn_costs(counter)
        except CountFailed:
            counter = None
    bt = BlockText(costs, seed)
    head = added + costs.start_tokens  # engine tokens before the first word's own
    built: list[int] = []  # indices of the requests whose prompt is built here
    texts: list[str] = []
    predicted: list[int] = []
    for k, r in enumerate(trace):
        if r.text is not None:
            continue
        left, i, blocks = max(1, r.input_tokens - head), 0, []
        while left > 0:
            n = min(left, MOONCAKE_BLOCK_TOKENS - (head if i == 0 else 0))
            n = max(1, n)
            blocks.append(bt.block(("h", r.hash_ids[i]) if i < len(r.hash_ids) else ("u", k, i), n))
            left, i = left - n, i + 1
        built.append(k)
        texts.append(join(blocks))
        predicted.append(costs.start_tokens + sum(bt.cost(b) for b in blocks))
    counts, counted = await check_counts(counter, texts, predicted)
    labelled = "tokenizer" if counted and (maker is None or maker.added_known) else "estimate"
    prompts: list[Prompt] = [
        Prompt(r.text, r.input_tokens, r.output_tokens, "input")
        if r.text is not None
        else Prompt("", None, 1)
        for r in trace
    ]
    for k, text, n in zip(built, texts, counts, strict=True):
        prompts[k] = Prompt(text, n + added, trace[k].output_tokens, labelled)
    shared = sum(1 for r in trace if r.hash_ids)
    how = (
        f"in the target's tokens ({len(costs.costs)} filler words' costs learned from its tokenizer)"
        if counter is not None
        else "as an estimate (one token a word: no tokenizer of the target)"
    )
    return prompts, (
        f"trace: {len(trace)} requests over {trace[-1].t_s:.1f} s; prompts sized {how}"
        + (f"; {shared} with hash_ids share their {MOONCAKE_BLOCK_TOKENS}-token blocks" if shared else "")
    )


def offsets(trace: list[TraceRequest]) -> tuple[float, ...]:
    """Each request's send time, in seconds from the window's start (the trace's own times)."""
    return tuple(r.t_s for r in trace)


def mean_rate(trace: list[TraceRequest]) -> float | None:
    """Requests per second over the trace's span (None for a trace of one instant)."""
    span = trace[-1].t_s - trace[0].t_s if trace else 0.0
    return (len(trace) - 1) / span if span > 0 else None


__all__ = [
    "FORMATS",
    "MOONCAKE_BLOCK_TOKENS",
    "TraceFormat",
    "TraceRequest",
    "mean_rate",
    "offsets",
    "parse_trace",
    "read_trace",
    "trace_prompts",
]
