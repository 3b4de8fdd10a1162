"""Where the requests' prompt token counts come from, in one line for the summaries: the engine's own
count (its usage), the target's tokenizer before sending (no usage in the answer), or an estimate."""

from __future__ import annotations

from collections import Counter

from vramlab.report.sections import ReportContext

_SAID = {
    "usage": "the engine's count (its usage)",
    "tokenizer": "counted in the target's tokenizer before sending (the engine reported no usage)",
    "input": "the input file's figure",
    "estimate": "an estimate (one token a word: the target could not count them)",
}


def prompt_tokens_line(ctx: ReportContext) -> str | None:
    """None when every request's count is the engine's own (nothing to warn about) or none was sent."""
    seen = Counter(r.prompt_tokens_source for r in ctx.requests if r.prompt_tokens is not None)
    total = sum(seen.values())
    if not total or set(seen) <= {"usage"}:
        return None
    parts = [f"{_SAID.get(str(k), str(k))} for {n:,}" for k, n in seen.most_common() if k is not None]
    if seen.get(None):
        parts.append(f"not recorded for {seen[None]:,}")
    return f"Prompt tokens of {total:,} requests: " + "; ".join(parts)


__all__ = ["prompt_tokens_line"]
