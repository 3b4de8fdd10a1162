"""Host resources through psutil: CPU, RAM, swap, and the target process's RSS when it runs here."""

from __future__ import annotations

import time

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
                out.append(
                    Sample(
                        "host",
                        "host.target_rss_bytes",
                        self._proc.memory_info().rss,
                        now,
                        {"pid": str(self._proc.pid)},
                    )
                )
            except psutil.Error:
                self._proc = None  # the target exited; its absence shows in the timeline
        return out

    async def sample(self) -> list[Sample]:
        return self.read()
