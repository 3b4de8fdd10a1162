"""The sim's simulated card, read through the same ``Devices`` interface as NVML.

``vramlab.sim.ledger.DeviceLedger`` exposes ``device_count/name/memory_info/processes``; the GPU
sampler reads it exactly as it reads a real card, with source ``ledger``.
"""

from __future__ import annotations

from pathlib import Path

from vramlab.observe.base import SourceUnavailable
from vramlab.observe.nvml import GpuSampler


class LedgerSampler(GpuSampler):
    def __init__(self, path: str | Path) -> None:
        super().__init__(devices=None, source="ledger")
        self.path = Path(path)

    async def open(self) -> None:
        if not self.path.exists():
            raise SourceUnavailable(f"no device ledger at {self.path}")
        try:
            from vramlab.sim.ledger import DeviceLedger
        except ImportError as exc:
            raise SourceUnavailable(f"the sim's ledger is not available ({exc})") from None
        from vramlab.errors import VramlabError

        try:
            self._devices = DeviceLedger(str(self.path))
        except VramlabError as exc:
            raise SourceUnavailable(str(exc)) from None
