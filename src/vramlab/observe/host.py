"""Host resources through psutil: CPU, RAM, swap, and the target's RSS when it runs here.

The target's RSS is its process tree's: vLLM's CPU build serves from three processes (the API server,
the engine core and its worker), each with torch loaded, so the pid the plan names (the API server)
holds a third of it. Shared pages (the torch libraries) count in each process, as `ps` counts them."""

from __future__ import annotations

import time
from typing import Any

from vramlab.observe.base import Sample, Sampler


class HostSampler(Sampler):
    source = "host"

    def __init__(self, target_pid: int | None = None) -> None:
        self.target_pid = target_pid
        self._proc = None

    async def open(self) -> None:
        import psutil

        psutil.cpu_percent(interval=None)  # the first call only sets the reference point
        if self.target_pid is not None:
            try:
                self._proc = psutil.Process(self.target_pid)
            except psutil.Error:
                self._proc = None

    def read(self) -> list[Sample]:
        import psutil

        now = time.perf_counter()
        vm, sw = psutil.virtual_memory(), psutil.swap_memory()
        out = [
            Sample("host", "host.cpu_percent", psutil.cpu_percent(interval=None), now),
            Sample("host", "host.ram_used_bytes", vm.total - vm.available, now),
            Sample("host", "host.ram_total_bytes", vm.total, now),
            Sample("host", "host.swap_used_bytes", sw.used, now),
        ]
        if self._proc is not None:
            try:
                rss, count = _tree_rss(self._proc)
                out.append(
                    Sample(
                        "host",
                        "host.target_rss_bytes",
                        rss,
                        now,
                        {"pid": str(self._proc.pid), "processes": str(count)},
                    )
                )
            except psutil.Error:
                self._proc = None  # the target exited; its absence shows in the timeline
        return out

    async def sample(self) -> list[Sample]:
        return self.read()


def _tree_rss(proc: Any) -> tuple[int, int]:
    """RSS of the process and every descendant still alive, and how many processes that is."""
    import psutil

    total, count = proc.memory_info().rss, 1
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
            count += 1
        except psutil.Error:
            continue  # it ended between the listing and the reading
    return total, count
