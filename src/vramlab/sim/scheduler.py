"""Continuous batching over a paged KV pool, the way vLLM V1's scheduler does it. Pure logic.

Each step serves the running requests first (one token each for decode, a chunk for a request
still prefilling), then admits waiting requests in arrival order while there are free blocks,
free sequence slots (`max_num_seqs`) and token budget (`max_num_batched_tokens`). When a
running request needs a block and none is free, the newest running request is preempted: its
blocks are freed and it goes back to the front of the waiting queue to be recomputed from
scratch (V1 knows only RECOMPUTE; vllm/v1/core/sched/scheduler.py).

With prefix caching (``cache``, sim/prefix_cache.py) a request is admitted with the longest prefix
of full blocks the pool already holds: those blocks are shared, not allocated, and only the rest of
its prompt is computed. Its full blocks are known by content as soon as they are computed, its
generated ones when it finishes; blocks nobody uses stay cached among the free ones until a new
block needs their memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vramlab.sim.prefix_cache import PrefixCache, block_hashes


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(eq=False)
class Request:
    id: str
    prompt_tokens: int
    max_tokens: int  # generation stops here ("length")
    stop_at: int  # ... or here, earlier, as if the model sampled EOS ("stop")
    key: str = ""  # what the generated text is derived from
    arrival_s: float = 0.0
    sink: Any = None  # where the server listens for tokens (an asyncio.Queue)
    generated: int = 0
    num_computed: int = 0  # tokens whose KV is in the pool
    blocks: int = 0
    preemptions: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    prev_token_s: float | None = (
        None  # the token before the last: inter-token latency includes preemption gaps
    )
    finished_reason: str | None = None
    hashes: tuple[int, ...] = ()  # the prompt's full blocks by content (prefix caching)
    tail: tuple[str, ...] = ()  # the prompt's tokens after its last full block
    shared: list[int] = field(default_factory=list)  # blocks held through the prefix cache (in `blocks`)
    cached_tokens: int = 0  # prompt tokens the prefix cache served at its last admission

    @property
    def known_tokens(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(frozen=True)
class Batch:
    scheduled: tuple[tuple[Request, int], ...]  # (request, tokens computed this step)
    preempted: tuple[Request, ...]

    decode_seqs: int = 0  # requests computing one token after their prompt (read at scheduling time)
    context_tokens: int = 0  # KV tokens attended over in this step

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def prefill_tokens(self) -> int:
        return self.num_tokens - self.decode_seqs


@dataclass
class Scheduler:
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    free_blocks: int = -1
    num_preemptions: int = 0
    cache: PrefixCache | None = None  # prefix caching on
    # a finished request's generated tokens (what the next turn of its conversation sends back)
    generated_tokens: Callable[[Request], list[str]] | None = None

    def __post_init__(self) -> None:
        if self.free_blocks < 0:
            self.free_blocks = self.num_blocks

    @property
    def kv_cache_usage(self) -> float:
        return 1.0 - self.free_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def used_tokens(self) -> int:
        return sum(r.num_computed for r in self.running)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
            self._free(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def _free(self, req: Request) -> None:
        own = req.blocks - len(req.shared)
        if self.cache is not None and req.shared:
            self.free_blocks += self.cache.release(req.shared)
            req.shared = []
        self.free_blocks += own
        req.blocks = 0

    def _grow(self, req: Request, tokens: int) -> bool:
        need = cdiv(req.num_computed + tokens, self.block_size) - req.blocks
        if need > self.free_blocks:
            return False
        if need > 0 and self.cache is not None:
            empty = self.free_blocks - len(self.cache.free)  # free blocks that hold nothing cached
            if need > empty:
                self.cache.evict(need - empty)
        self.free_blocks -= max(0, need)
        req.blocks += max(0, need)
        return True

    def _admit_cached(self, req: Request) -> None:
        """A request about to be admitted takes the longest cached prefix of its prompt."""
        cache = self.cache
        if cache is None or req.num_computed:
            return
        hit = cache.hit_blocks(req.hashes)
        hit = min(hit, (req.prompt_tokens - 1) // self.block_size)  # the last token is always computed
        req.cached_tokens = hit * self.block_size
        if hit:
            self.free_blocks -= cache.take(req.hashes[:hit])
            req.shared = list(req.hashes[:hit])
            req.blocks = hit
            req.num_computed = hit * self.block_size

    def _unadmit(self, req: Request) -> None:
        """The head of the queue could not get its blocks: it lets its cached prefix go again."""
        if req.shared:
            self._free(req)
            req.num_computed = 0

    def _register(self, req: Request) -> None:
        """Its computed full prompt blocks are now known by content (up to the first one another
        request computed too: from there on its blocks stay its own)."""
        cache = self.cache
        if cache is None:
            return
        upto = min(len(req.hashes), req.num_computed // self.block_size)
        while len(req.shared) < upto:
            if not cache.register(req.hashes[len(req.shared)]):
                break
            req.shared.append(req.hashes[len(req.shared)])

    def _register_generated(self, req: Request) -> None:
        """At its end, its full blocks of prompt tail and generated tokens join the cache too (a
        conversation's next turn sends them back)."""
        cache, gen = self.cache, self.generated_tokens
        if cache is None or gen is None or len(req.shared) != len(req.hashes) or not req.hashes:
            return
        full = req.num_computed // self.block_size - len(req.hashes)  # blocks of tokens with KV
        if full <= 0:
            return
        hashes, _ = block_hashes([*req.tail, *gen(req)], self.block_size, req.hashes[-1])
        for h in hashes[:full]:
            if not cache.register(h):
                break
            req.shared.append(h)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._free(req)
        req.num_computed = 0
        req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def schedule(self) -> Batch:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        for req in list(self.running):
            if req not in self.running:  # preempted below to make room for an older one
                continue
            n = min(req.known_tokens - req.num_computed, budget)
            if n <= 0:
                continue
            while not self._grow(req, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                budget += sum(k for r, k in scheduled if r is victim)
                scheduled = [(r, k) for r, k in scheduled if r is not victim]
                if victim is req:
                    break
            else:
                scheduled.append((req, n))
                budget -= n
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            self._admit_cached(req)
            n = min(req.known_tokens - req.num_computed, budget)
            if not self._grow(req, n):
                self._unadmit(req)
                break  # FCFS: nobody overtakes the head of the queue
            if self.cache is not None:  # counted once admitted, as the engine's counters see it
                self.cache.count(req.prompt_tokens, req.cached_tokens)
            self.waiting.popleft()
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        decode = sum(1 for r, n in scheduled if n == 1 and r.generated > 0)
        context = sum(r.num_computed + n for r, n in scheduled)
        return Batch(tuple(scheduled), tuple(preempted), decode, context)

    def complete(self, batch: Batch, now_s: float) -> list[tuple[Request, bool]]:
        """Apply a finished step: KV advances; requests whose KV caught up sample a token.

        Returns (request, finished) for every request that produced a token.
        """
        out: list[tuple[Request, bool]] = []
        for req, n in batch.scheduled:
            if req not in self.running:
                continue
            req.num_computed += n
            self._register(req)
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now_s
            if req.num_computed < req.known_tokens:
                continue  # a chunked prefill not done yet
            req.generated += 1
            if req.first_token_s is None:
                req.first_token_s = now_s
            req.prev_token_s, req.last_token_s = req.last_token_s, now_s
            done = None
            if req.generated >= req.stop_at:
                done = "stop" if req.stop_at < req.max_tokens else "length"
            if req.known_tokens >= self.max_model_len:
                done = done or "length"
            if done:
                req.finished_reason = done
                self.running.remove(req)
                self._register_generated(req)
                self._free(req)
            out.append((req, done is not None))
        return out
