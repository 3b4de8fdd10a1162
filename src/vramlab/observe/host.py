"""Host resources through psutil: CPU, RAM, swap, and the target process's RSS when it runs here.

The target's RSS counts its child processes too (vLLM's engine core, a shell's `exec`-less child):
the memory the serving process tree holds. A drill that started the target follows its pid across
restarts (``pid_of``).
Shared pages (the torch libraries) count in each process, as `ps` counts them: vLLM's CPU build serves
from three processes (API server, engine core, worker), each with torch loaded."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vramlab.observe.base import Sample, Sampler


class HostSampler(Sampler):
    source = "host"

    def __init__(self, target_pid: int | None = None, pid_of: Callable[[], int | None] | None = None) -> None:
        self.target_pid = target_pid
        self.pid_of = pid_of
        self._proc: Any = None

    async def open(self) -> None:
        import psutil

        psutil.cpu_percent(interval=None)  # the first call only sets the reference point
        self._follow(self.target_pid)

    def _follow(self, pid: int | None) -> None:
        import psutil

        if pid is None or (self._proc is not None and self._proc.pid == pid):
            return
        try:
            self._proc = psutil.Process(pid)
        except psutil.Error:
            self._proc = None

    def _tree_rss(self) -> tuple[int, int]:
        """(RSS of the target and its descendants, how many processes)."""
        import psutil

        procs = [self._proc]
        try:
            procs += self._proc.children(recursive=True)
        except psutil.Error:
            pass
        total, n = 0, 0
        for p in procs:
            try:
                total += p.memory_info().rss
                n += 1
            except psutil.Error:
                if p is self._proc:
                    raise
        return total, n

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
        if self.pid_of is not None:
            self._follow(self.pid_of())
        if self._proc is not None:
            try:
                rss, n = self._tree_rss()
                labels = {"pid": str(self._proc.pid), "processes": str(n)}
                out.append(Sample("host", "host.target_rss_bytes", rss, now, labels))
            except psutil.Error:
                self._proc = None  # the target exited; its absence shows in the timeline
        return out

    async def sample(self) -> list[Sample]:
        return self.read()
