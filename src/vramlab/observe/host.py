"""Host resources through psutil: CPU, RAM, swap, and the target process's RSS when it runs here.

The target's RSS counts its child processes too (vLLM's engine core, a shell's `exec`-less child):
the memory the serving process tree holds. A drill that started the target follows its pid across
restarts (``pid_of``).
Shared pages (the torch libraries) count in each process, as `ps` counts them: vLLM's CPU build serves
from three processes (API server, engine core, worker), each with torch loaded. Each process of the tree
is also read on its own (``host.process_rss_bytes``, labelled with its pid and its name as the kernel
shows it: vLLM 0.32 names its children ``VLLM::EngineCore`` and ``VLLM::Worker``), so a calibration can
tell the worker, which holds the model and the KV cache, from the front end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vramlab.observe.base import Sample, Sampler

MAX_PROCESSES = 32  # a serving tree is a handful of processes; more are summed, not each sampled


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

    def _tree_rss(self) -> list[tuple[int, str, int]]:
        """(pid, name, RSS) of the target and each of its descendants (those that are still there)."""
        import psutil

        procs = [self._proc]
        try:
            procs += self._proc.children(recursive=True)
        except psutil.Error:
            pass
        out = []
        for p in procs:
            try:
                out.append((p.pid, p.name(), int(p.memory_info().rss)))
            except psutil.Error:
                if p is self._proc:
                    raise
        return out

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
                tree = self._tree_rss()
                labels = {"pid": str(self._proc.pid), "processes": str(len(tree))}
                out.append(Sample("host", "host.target_rss_bytes", sum(r for _, _, r in tree), now, labels))
                out += [
                    Sample("host", "host.process_rss_bytes", rss, now, {"pid": str(pid), "name": name[:64]})
                    for pid, name, rss in tree[:MAX_PROCESSES]
                ]
            except psutil.Error:
                self._proc = None  # the target exited; its absence shows in the timeline
        return out

    async def sample(self) -> list[Sample]:
        return self.read()
