"""Continuous batching over a paged KV pool, the way vLLM V1's scheduler does it. Pure logic.

Each step serves the running requests first (one token each for decode, a chunk for a request
still prefilling), then admits waiting requests in arrival order while there are free blocks,
free sequence slots (`max_num_seqs`) and token budget (`max_num_batched_tokens`). When a
running request needs a block and none is free, the newest running request is preempted: its
blocks are freed and it goes back to the front of the waiting queue to be recomputed from
scratch (V1 knows only RECOMPUTE; vllm/v1/core/sched/scheduler.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


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
        self.free_blocks += req.blocks
        req.blocks = 0

    def _grow(self, req: Request, tokens: int) -> bool:
        need = cdiv(req.num_computed + tokens, self.block_size) - req.blocks
        if need > self.free_blocks:
            return False
        self.free_blocks -= max(0, need)
        req.blocks += max(0, need)
        return True

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
            n = min(req.known_tokens - req.num_computed, budget)
            if not self._grow(req, n):
                break  # FCFS: nobody overtakes the head of the queue
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
                self._free(req)
            out.append((req, done is not None))
        return out
