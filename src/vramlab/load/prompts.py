"""The fixed input set: synthetic prompts of a given token length with a seed, or a JSONL file.

Synthetic prompts are built from a fixed list of common English words. With a counter in the
target's own tokenizer (load/tokens.py), ``PromptMaker`` sizes each prompt until the engine would
count ``prompt_tokens`` (the chat template's tokens included), and each prompt carries that count,
labelled ``tokenizer``. Without one, ``synthetic_prompts`` takes one word for a token (each word is
one token in the Llama, Qwen and GPT BPE vocabularies when preceded by a space; the chat template
adds a few) and labels the count an ``estimate``. The same seed gives the same prompts, byte for
byte, for the same tokenizer.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from vramlab.errors import ConfigError

# Short, frequent words: single tokens in the common BPE vocabularies.
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will can more other its who "
    "into some time two them could may then only these over new first any after also made most what out "
    "like very well back where just good work year people long way down day each much through great might "
    "see man old still such own part life take last world place small make house under water number sound"
).split()
FILLER_WORDS: tuple[str, ...] = tuple(_WORDS)  # what block prompts (load/blocks.py) are made of


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_tokens: int | None
    output_tokens: int
    # how prompt_tokens is known: "tokenizer" (counted in the target's tokenizer), "estimate" (one
    # token a word), "input" (the input file said so); None: unknown
    tokens_source: str | None = None
    # a conversation's turn (load/conversations.py): the messages before this one, as (role, content)
    # pairs, and where it belongs; the client keeps its answer's text for the next turn
    history: tuple[tuple[str, str], ...] = ()
    conversation: str | None = None
    turn: int | None = None
    tenant: str | None = None
    # a conversation's later questions, walked in order by the user that draws it, and the pause
    # (a tool call) before each of them
    follow_ups: tuple[str, ...] = ()
    pauses_s: tuple[float, ...] = ()


def synthetic_text(n_tokens: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_tokens))


def synthetic_prompts(prompt_tokens: int, output_tokens: int, count: int, seed: int) -> list[Prompt]:
    """``count`` distinct prompts; a unique prefix keeps prefix caches from serving them for free."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        head = f"#{seed}-{i}:"
        body = synthetic_text(max(prompt_tokens - 3, 1), rng)
        out.append(Prompt(f"{head} {body}", prompt_tokens, output_tokens, "estimate"))
    return out


@dataclass(frozen=True)
class FreshPrompts:
    """A prompt that is new on every request: one sized body behind a head naming the lane and the
    request, in digits of one width (the same tokens in every tokenizer met so far; checked where
    the target counts). No request's first block matches an earlier one's, so an engine's prefix
    cache (vLLM's automatic prefix caching, SGLang's radix cache, llama-server's slot cache) serves
    none of it: every request of a step prefills and holds the KV its length names. A list cycled
    by every lane sent the same prompt from each user at once and again every 64 requests, which
    a caching engine held once."""

    seed: int
    body: str  # the text after the head
    prompt_tokens: int | None
    output_tokens: int
    tokens_source: str | None
    epoch: int = 0  # 0-9: another window sending the same set (a recovery at the failed step's load)

    def head(self, lane: int, i: int) -> str:
        return f"#{self.seed}-{self.epoch % 10}{lane % 10_000:04d}-{i % 10_000_000:07d}:"

    def stream(self, lane: int) -> Iterator[Prompt]:
        """Lane *lane*'s prompts, each used once (the count wraps after ten million)."""
        body, pt, out, src = self.body, self.prompt_tokens, self.output_tokens, self.tokens_source
        for i in itertools.count():
            yield Prompt(self.head(lane, i) + body, pt, out, src)


def fresh_estimate(prompt_tokens: int, output_tokens: int, seed: int) -> FreshPrompts:
    """Fresh prompts without a counter: a word a token, the head's few tokens taken off (an estimate)."""
    body = " " + synthetic_text(max(prompt_tokens - 8, 1), random.Random(seed))
    return FreshPrompts(seed, body, prompt_tokens, output_tokens, "estimate")


class Counter(Protocol):
    async def count(self, text: str) -> int: ...  # raises CountFailed when it cannot


class CountFailed(Exception):
    """The counter could not count (the target stopped answering): the prompts fall back to words."""


MAX_COUNTS = 8  # counts per prompt while sizing it: a word search, then one-token fillers
_FILLER = "a"  # one token after a space in BPE and SentencePiece vocabularies, and in the sim's


class PromptMaker:
    """Synthetic prompts of ``prompt_tokens`` tokens as the target counts them.

    ``counter`` counts a text as the completions API sends it; ``added_tokens`` is what the engine
    adds around it (the chat template, a BOS), measured once (load/tokens.py); ``added_known``
    False when that could not be measured: the counts are then an estimate. Without a counter
    the prompts are ``synthetic_prompts``. Input sets are cached: a value built once is reused."""

    def __init__(self, counter: Counter | None = None, added_tokens: int = 0, added_known: bool = True):
        self.counter, self.added_tokens, self.added_known = counter, added_tokens, added_known
        self._per_word = 1.0  # tokens a word, learned from the prompts sized so far
        self._head_tokens: int | None = None
        self._cache: dict[tuple[int, int, int, int], list[Prompt]] = {}
        self._fresh: dict[tuple[int, int, int], FreshPrompts | None] = {}

    async def synthetic(self, prompt_tokens: int, output_tokens: int, count: int, seed: int) -> list[Prompt]:
        key = (prompt_tokens, output_tokens, count, seed)
        if key not in self._cache:
            self._cache[key] = await self._build(*key)
        return self._cache[key]

    async def fresh(self, prompt_tokens: int, output_tokens: int, seed: int) -> FreshPrompts | None:
        """Fresh prompts of ``prompt_tokens`` as the target counts them; None where heads of other
        digits count differently (the caller cycles a counted list instead)."""
        key = (prompt_tokens, output_tokens, seed)
        if key not in self._fresh:
            self._fresh[key] = await self._build_fresh(prompt_tokens, output_tokens, seed)
        return self._fresh[key]

    async def _build_fresh(self, prompt_tokens: int, output_tokens: int, seed: int) -> FreshPrompts | None:
        if self.counter is None:
            return fresh_estimate(prompt_tokens, output_tokens, seed)
        probe = FreshPrompts(seed, "", None, output_tokens, None)
        try:
            head = probe.head(0, 0)
            head_tokens = await self.counter.count(head)
            target = max(1, prompt_tokens - self.added_tokens)
            text, n = await self._fit(head, random.Random(seed), target, head_tokens)
            body = text[len(head) :]
            for other, lane, i in ((probe, 1234, 9_876_543), (replace(probe, epoch=9), 9_999, 5_555_555)):
                if await self.counter.count(other.head(lane, i) + body) != n:
                    return None
        except CountFailed:
            return fresh_estimate(prompt_tokens, output_tokens, seed)
        source = "tokenizer" if self.added_known else "estimate"
        return FreshPrompts(seed, body, n + self.added_tokens, output_tokens, source)

    async def _build(self, prompt_tokens: int, output_tokens: int, count: int, seed: int) -> list[Prompt]:
        if self.counter is not None:
            try:
                return await self._counted(prompt_tokens, output_tokens, count, seed)
            except CountFailed:
                pass  # labelled an estimate, each prompt: the stored rows say so
        return synthetic_prompts(prompt_tokens, output_tokens, count, seed)

    async def _counted(self, prompt_tokens: int, output_tokens: int, count: int, seed: int) -> list[Prompt]:
        """One body sized to the target, behind *count* heads that differ in their digits only (one
        width: the same tokens in every tokenizer met so far). Two of them are counted to check it;
        where they differ, every prompt is counted and carries its own count."""
        counter = self.counter
        assert counter is not None
        source = "tokenizer" if self.added_known else "estimate"
        target = max(1, prompt_tokens - self.added_tokens)
        width = len(str(max(0, count - 1)))
        heads = [f"#{seed}-{i:0{width}d}:" for i in range(count)]
        if self._head_tokens is None:
            self._head_tokens = await counter.count(heads[0])
        text0, n = await self._fit(heads[0], random.Random(seed), target, self._head_tokens)
        texts = [h + text0[len(heads[0]) :] for h in heads]
        counts = {0: n}
        for i in {1, count - 1} - {0} if count > 1 else ():
            counts[i] = await counter.count(texts[i])
        if any(c != n for c in counts.values()):
            for i in range(count):
                if i not in counts:
                    counts[i] = await counter.count(texts[i])
        return [
            Prompt(t, counts.get(i, n) + self.added_tokens, output_tokens, source)
            for i, t in enumerate(texts)
        ]

    async def _fit(self, head: str, rng: random.Random, target: int, head_tokens: int) -> tuple[str, int]:
        """A text the counter counts as *target* tokens (or the closest found): whole words first,
        then one-token fillers for the last few."""
        assert self.counter is not None
        words: list[str] = []

        def text(k: int, fill: int = 0) -> str:
            while len(words) < k:
                words.append(rng.choice(_WORDS))
            return " ".join([head, *words[:k], *([_FILLER] * fill)])

        k = max(1, round((target - head_tokens) / self._per_word))
        best: tuple[str, int] | None = None
        under: tuple[int, int] | None = None  # the most words whose count stayed within the target
        for _ in range(MAX_COUNTS // 2):
            t = text(k)
            n = await self.counter.count(t)
            if best is None or abs(n - target) < abs(best[1] - target):
                best = (t, n)
            if n <= target and (under is None or k > under[0]):
                under = (k, n)
            if k > 0 and n > head_tokens:
                self._per_word = max(0.25, (n - head_tokens) / k)
            step = round((target - n) / self._per_word)
            if n == target or step == 0:
                break
            k = max(1, k + step)
        assert best is not None
        k, n = under if under is not None else (1, best[1])
        fill = target - n
        for _ in range(MAX_COUNTS // 2):
            if best[1] == target or fill <= 0:
                break
            t = text(k, fill)
            got = await self.counter.count(t)
            if abs(got - target) < abs(best[1] - target):
                best = (t, got)
            fill -= got - target
        return best


def jsonl_prompts(path: str | Path, default_output_tokens: int = 256) -> list[Prompt]:
    """One JSON object a line: ``{"prompt": str, "max_tokens"?: int, "prompt_tokens"?: int}``."""
    p = Path(path)
    out = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read the input set: {exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}:{n}: not JSON: {exc.msg}") from None
        text = obj.get("prompt") if isinstance(obj, dict) else None
        if not isinstance(text, str) or not text:
            raise ConfigError(f"{p}:{n}: prompt: each line needs a non-empty string 'prompt'")
        max_tokens = obj.get("max_tokens", obj.get("output_tokens", default_output_tokens))
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ConfigError(f"{p}:{n}: max_tokens: must be a positive integer")
        pt = obj.get("prompt_tokens")
        out.append(
            Prompt(text, pt, max_tokens, "input") if isinstance(pt, int) else Prompt(text, None, max_tokens)
        )
    if not out:
        raise ConfigError(f"{p}: the input set is empty")
    return out


def input_set_key(prompts: list[Prompt]) -> str:
    """A digest of an input set's content: the same prompts give the same key, other prompts another."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for p in prompts:
        h.update(f"{len(p.text)}:{p.prompt_tokens}:{p.output_tokens}:".encode())
        h.update(p.text.encode())
    return h.hexdigest()


def cycle(prompts: list[Prompt]) -> Iterator[Prompt]:
    """The input set, repeated in order: every window sees the same prompts in the same order."""
    while True:
        yield from prompts
