"""What PyTorch's CUDA caching allocator reserves for a sequence of allocations (and frees).

Engines that read free memory with `torch.cuda.mem_get_info()` after `torch.cuda.empty_cache()`
(SGLang's `get_available_gpu_memory`, every release) see the allocator's segments, not the tensors'
bytes: `empty_cache` returns only segments with nothing live in them. The rules, from
c10/cuda/CUDACachingAllocator.cpp (`round_size`, `get_allocation_size`, `should_split`,
`get_free_block`; unchanged since PyTorch 1.x when expandable segments are off, the default):

- a request is rounded up to a multiple of 512 bytes;
- up to 1 MiB it comes from the small pool (2 MiB segments, split down to 512 bytes);
- above 1 MiB it takes the smallest free large-pool block that fits (best fit), else a new
  segment of 20 MiB (requests under 10 MiB) or the request rounded up to 2 MiB;
- a large block is split only when more than 1 MiB would remain: a remainder of 1 MiB or less
  stays inside the block, and a split-off remainder stays reserved while its segment holds a live
  tensor.

So loading hundreds of weight matrices whose sizes are not multiples of 2 MiB costs up to ~2 MiB
each on top of their bytes (Qwen2.5-32B at TP 4: 0.22 GiB).

With frees (`Allocator`): a freed block merges with free neighbours of its own segment
(`free_block` / `try_merge_blocks`), and `empty_cache` releases only segments that are one free
block (`release_cached_blocks`). A smaller tensor that best-fits into a freed block's segment keeps
the whole segment reserved.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # kSmallSize
SMALL_BUFFER = 2 << 20  # kSmallBuffer
LARGE_BUFFER = 20 << 20  # kLargeBuffer
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge


def round_size(size: int) -> int:
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def allocation_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def reserved_bytes(sizes: Iterable[int]) -> int:
    """Bytes of the segments the allocator holds after allocating *sizes* in order (none freed)."""
    free: list[int] = []  # free large-pool block sizes, sorted
    reserved = 0
    small_free = 0
    for raw in sizes:
        size = round_size(int(raw))
        if size <= SMALL_SIZE:
            if small_free < size:
                reserved += SMALL_BUFFER
                small_free += SMALL_BUFFER
            small_free -= size
            continue
        at = bisect.bisect_left(free, size)
        if at < len(free):
            block = free.pop(at)
        else:
            block = allocation_size(size)
            reserved += block
        remaining = block - size
        if remaining > SMALL_SIZE:
            bisect.insort(free, remaining)
    return reserved


def rounding_bytes(sizes: Iterable[int]) -> int:
    """Reserved minus requested: what the allocator's rounding and unsplit remainders add."""
    sizes = list(sizes)
    return reserved_bytes(sizes) - sum(int(s) for s in sizes)


class Allocator:
    """The large pool as blocks inside segments, with frees and `empty_cache`; the small pool (<= 1 MiB
    requests, 2 MiB segments) as in `reserved_bytes`, never released. Ties among equal free blocks go to
    the older segment and lower offset (PyTorch orders by address)."""

    def __init__(self) -> None:
        self.segments: dict[int, list[list[int]]] = {}  # segment -> [offset, size, live] blocks by offset
        self.free: list[tuple[int, int, int]] = []  # (size, segment, offset) of free large blocks, sorted
        self.small_reserved = 0
        self.small_free = 0
        self.next_segment = 0

    def alloc(self, raw: int) -> tuple[int, int] | None:
        """Returns the block's (segment, offset), or None for a small-pool request."""
        size = round_size(int(raw))
        if size <= SMALL_SIZE:
            if self.small_free < size:
                self.small_reserved += SMALL_BUFFER
                self.small_free += SMALL_BUFFER
            self.small_free -= size
            return None
        at = bisect.bisect_left(self.free, (size, -1, -1))
        if at < len(self.free):
            _, seg, off = self.free.pop(at)
        else:
            seg, off = self.next_segment, 0
            self.next_segment += 1
            self.segments[seg] = [[0, allocation_size(size), 0]]
        blocks = self.segments[seg]
        i = next(k for k, b in enumerate(blocks) if b[0] == off)
        block = blocks[i]
        if block[1] - size > SMALL_SIZE:
            blocks.insert(i + 1, [off + size, block[1] - size, 0])
            bisect.insort(self.free, (block[1] - size, seg, off + size))
            block[1] = size
        block[2] = 1
        return seg, off

    def release(self, handle: tuple[int, int] | None, raw: int = 0) -> None:
        """Frees a block (a small-pool request gives its rounded bytes back to the pool)."""
        if handle is None:
            self.small_free += round_size(int(raw))
            return
        seg, off = handle
        blocks = self.segments[seg]
        i = next(k for k, b in enumerate(blocks) if b[0] == off)
        blocks[i][2] = 0
        for j in (i + 1, i):  # merge the next block into this one, then this one into the previous
            if 0 < j < len(blocks) and not blocks[j][2] and not blocks[j - 1][2]:
                prev, cur = blocks[j - 1], blocks[j]
                for b in (prev, cur):
                    entry = (b[1], seg, b[0])
                    k = bisect.bisect_left(self.free, entry)
                    if k < len(self.free) and self.free[k] == entry:
                        self.free.pop(k)
                prev[1] += cur[1]
                del blocks[j]
        merged = next(b for b in blocks if b[0] <= off < b[0] + b[1])
        entry = (merged[1], seg, merged[0])
        k = bisect.bisect_left(self.free, entry)
        if k == len(self.free) or self.free[k] != entry:
            self.free.insert(k, entry)

    def empty_cache(self) -> None:
        for seg in [s for s, blocks in self.segments.items() if len(blocks) == 1 and not blocks[0][2]]:
            size = self.segments.pop(seg)[0][1]
            self.free.remove((size, seg, 0))

    def reserved(self) -> int:
        return self.small_reserved + sum(b[1] for blocks in self.segments.values() for b in blocks)
