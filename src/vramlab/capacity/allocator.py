"""What PyTorch's CUDA caching allocator reserves for a sequence of allocations (no frees).

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
