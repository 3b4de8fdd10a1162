"""Prompts built from blocks of text of a known length in the target's own tokens, so that equal
block keys give equal text and equal prefixes: a trace's ``hash_ids`` (load/trace.py), a
conversation's shared system prompt (load/conversations.py).

What each filler word costs is learned once from the target's tokenizer (load/tokens.py): the
count of a text of eight copies of the word, less that of the text without them, over eight. A
word whose copies do not add up (a tokenizer that merges across spaces) is left out. Every block is
then composed locally, word by word, to its exact length: a long trace needs no tokenize request
per prompt. What a text costs at its start (a BOS the endpoint counts, a first word without its
space) is measured once too, and a few of the built prompts are counted back: where one disagrees,
every prompt is counted and carries its own count. Without a tokenizer every word counts one
token and the counts are an estimate, as for synthetic prompts.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from vramlab.load.prompts import FILLER_WORDS, Counter, CountFailed

REPEAT = 8  # copies of a word counted to learn its cost
PARALLEL_COUNTS = 8  # tokenize requests in flight while learning costs or checking prompts
CHECKED_PROMPTS = 4  # prompts counted back after building (all of them where one disagrees)


@dataclass(frozen=True)
class WordCosts:
    """Tokens each usable word costs after a space, and what a text adds at its start."""

    costs: dict[str, int]
    start_tokens: int  # count(text) - sum of its words' costs (a BOS, the first word's missing space)
    counted: bool  # learned from the target's tokenizer (False: one token a word, an estimate)

    @property
    def cheapest(self) -> str:
        return min(self.costs, key=lambda w: (self.costs[w], w))


ESTIMATE = WordCosts({w: 1 for w in FILLER_WORDS}, 0, False)


async def learn_costs(counter: Counter) -> WordCosts:
    """Each word's cost in *counter*'s tokens (one count a word, PARALLEL_COUNTS at a time)."""
    head = "#"
    sem = asyncio.Semaphore(PARALLEL_COUNTS)

    async def count(text: str) -> int:
        async with sem:
            return await counter.count(text)

    base = await count(head)
    words = list(dict.fromkeys(FILLER_WORDS))
    got = await asyncio.gather(*(count(head + f" {w}" * REPEAT) for w in words))
    costs = {}
    for w, n in zip(words, got, strict=True):
        diff = n - base
        if diff > 0 and diff % REPEAT == 0:
            costs[w] = diff // REPEAT
    if not costs:
        raise CountFailed("no filler word adds up to a whole number of tokens in this tokenizer")
    probe = [w for w in words if w in costs][:3]
    start = await count(" ".join(probe)) - sum(costs[w] for w in probe)
    return WordCosts(costs, start, True)


class BlockText:
    """Texts of an exact cost, one per key: the same key (and length) always gives the same text."""

    def __init__(self, costs: WordCosts, seed: int = 0) -> None:
        self.costs, self.seed = costs, seed
        usable = sorted(costs.costs, key=lambda w: (costs.costs[w], w))
        self._words = usable
        self._max = max(costs.costs.values())
        self._fill = [w for w in usable if costs.costs[w] == costs.costs[costs.cheapest]]
        self._cache: dict[tuple[Hashable, int], str] = {}

    def block(self, key: Hashable, tokens: int) -> str:
        """Words costing *tokens* in all (the fewest-token fillers close the gap; exact whenever
        a word costs one token, as in every tokenizer met so far)."""
        ck = (key, tokens)
        text = self._cache.get(ck)
        if text is not None:
            return text
        rng = random.Random(f"{self.seed}:{key!r}")
        cost, out, left = self.costs.costs, [], tokens
        while left > self._max:
            w = rng.choice(self._words)
            out.append(w)
            left -= cost[w]
        while left > 0:
            fits = [w for w in self._words if cost[w] <= left]
            if not fits:
                break
            w = rng.choice([f for f in fits if cost[f] == max(cost[x] for x in fits)])
            out.append(w)
            left -= cost[w]
        text = " ".join(out)
        self._cache[ck] = text
        return text

    def cost(self, text: str) -> int:
        """What *text* (built here) costs after a space; its count at a text's start adds start_tokens."""
        return sum(self.costs.costs[w] for w in text.split())


def join(blocks: Sequence[str]) -> str:
    return " ".join(b for b in blocks if b)


async def check_counts(
    counter: Counter | None, texts: list[str], predicted: list[int]
) -> tuple[list[int], bool]:
    """(the counts to trust, whether they were counted): a few prompts counted back; where one
    differs from its prediction, every one is counted. Without a counter, the predictions."""
    if counter is None or not texts:
        return predicted, False
    sem = asyncio.Semaphore(PARALLEL_COUNTS)

    async def count(i: int) -> int:
        async with sem:
            return await counter.count(texts[i])

    picks = sorted({0, len(texts) - 1, len(texts) // 2, max(range(len(texts)), key=lambda i: predicted[i])})
    sample = await asyncio.gather(*(count(i) for i in picks[:CHECKED_PROMPTS]))
    if all(n == predicted[i] for i, n in zip(picks, sample, strict=False)):
        return predicted, True
    return list(await asyncio.gather(*(count(i) for i in range(len(texts))))), True


__all__ = ["ESTIMATE", "BlockText", "WordCosts", "check_counts", "join", "learn_costs"]
