"""Prefix caching over the paged pool, counted the way vLLM V1's KV cache manager counts it. Pure.

A full block of tokens is known by a hash chained over every token before it (the block's own
tokens and its parent's hash: vllm/v1/core/kv_cache_utils.py, ``hash_block_tokens``), so two
requests share a block only when everything in front of it is the same. A computed full block is
kept once, whatever the number of running requests that use it (a reference count); when its last
user leaves it stays in the pool as a free block that still holds its tokens, and a later request
with the same prefix takes it back instead of computing it again. A new block is taken from the
free blocks that hold nothing first, then by evicting the cached block freed longest ago (vLLM's
free block queue: least recently used first). Only full blocks are cached; a request whose whole
prompt is cached still computes its last token (vLLM recomputes it to get the logits).

Hits and queries are counted in tokens per scheduled request, as vLLM's ``prefix_cache_queries``
and ``prefix_cache_hits`` counters are (vllm/v1/metrics/loggers.py, vLLM 0.10).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def block_hashes(
    tokens: Sequence[str], block_size: int, parent: int | None = None
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(the chained hash of every full block of *tokens*, the tokens after the last full block)."""
    out: list[int] = []
    n_full = len(tokens) // block_size
    h = parent
    for i in range(n_full):
        h = hash((h, tuple(tokens[i * block_size : (i + 1) * block_size])))
        out.append(h)
    return tuple(out), tuple(tokens[n_full * block_size :])


@dataclass
class PrefixCache:
    """Which full blocks the pool holds by content: in use (reference counts) or free but cached."""

    used: dict[int, int] = field(default_factory=dict)  # hash -> running requests holding it
    free: OrderedDict[int, None] = field(default_factory=OrderedDict)  # cached, unused; oldest first
    queries_tokens: int = 0
    hits_tokens: int = 0
    requests: int = 0
    evictions: int = 0

    def hit_blocks(self, hashes: Sequence[int]) -> int:
        """How many of the leading blocks the pool holds (the longest cached prefix)."""
        n = 0
        for h in hashes:
            if h not in self.used and h not in self.free:
                break
            n += 1
        return n

    def take(self, hashes: Sequence[int]) -> int:
        """Hold these cached blocks for one more request; returns how many left the free blocks."""
        revived = 0
        for h in hashes:
            if h in self.free:
                del self.free[h]
                revived += 1
                self.used[h] = 1
            else:
                self.used[h] += 1
        return revived

    def release(self, hashes: Sequence[int]) -> int:
        """One request lets these go; returns how many are now free (still cached, newest last)."""
        freed = 0
        for h in reversed(hashes):  # the tail of a prefix goes first when evicting (vLLM frees in reverse)
            n = self.used[h] - 1
            if n:
                self.used[h] = n
            else:
                del self.used[h]
                self.free[h] = None
                freed += 1
        return freed

    def register(self, h: int) -> bool:
        """A request computed this block: the pool knows it by content from now on. False when
        another request's copy is already known (this one stays the request's own)."""
        if h in self.used or h in self.free:
            return False
        self.used[h] = 1
        return True

    def evict(self, n: int) -> int:
        """Forget the *n* cached free blocks freed longest ago (a new block needs their memory)."""
        k = min(n, len(self.free))
        for _ in range(k):
            self.free.popitem(last=False)
        self.evictions += k
        return k

    def count(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.requests += 1
        self.queries_tokens += prompt_tokens
        self.hits_tokens += hit_tokens

    @property
    def hit_rate(self) -> float:
        return self.hits_tokens / self.queries_tokens if self.queries_tokens else 0.0


__all__ = ["PrefixCache", "block_hashes"]
