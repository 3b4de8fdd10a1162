"""This machine's memory, for a plan on the host (`--gpu cpu`) when --host-memory-gib is not given."""

from __future__ import annotations

from pathlib import Path


def host_memory_gib(meminfo: str = "/proc/meminfo") -> float | None:
    """MemTotal in GiB (2^30 bytes), what vLLM's CPU worker reads as the node's total; None where unreadable."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / (1 << 30)
    except (OSError, ValueError, IndexError):
        return None
    return None
