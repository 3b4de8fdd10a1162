"""GPU memory through NVML (``nvidia-ml-py``, imported lazily), behind the same small device
interface as the sim's ledger: ``device_count``, ``name``, ``memory_info``, ``processes``.

Memory uses ``nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2)`` where the driver has it, so
``reserved`` is separate from ``used`` (v1 folds it in). Xid events are polled without blocking.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from vramlab.observe.base import Sample, Sampler, SourceUnavailable

# nvidia-ml-py reports "not available" per-process memory as ULONGLONG_MAX (nvitop does the same mapping).
_NA = 2**64 - 1


class Devices(Protocol):
    def device_count(self) -> int: ...
    def name(self, index: int) -> str: ...
    def memory_info(self, index: int) -> tuple[int, int, int]: ...  # total, used, free
    def processes(self, index: int) -> list[tuple[int, int, str]]: ...  # pid, used_bytes, name


class NvmlDevices:
    """NVML as ``Devices``. ``nvml`` is the ``pynvml`` module, or a fake with the same functions."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise SourceUnavailable("nvidia-ml-py is not installed") from exc
            nvml = pynvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise SourceUnavailable(f"no NVIDIA driver ({exc})") from None
        self._events: Any = None
        self.reserved: dict[int, int] = {}

    def _h(self, i: int) -> Any:
        return self.nvml.nvmlDeviceGetHandleByIndex(i)

    def device_count(self) -> int:
        return int(self.nvml.nvmlDeviceGetCount())

    def name(self, index: int) -> str:
        n = self.nvml.nvmlDeviceGetName(self._h(index))
        return n.decode() if isinstance(n, bytes) else str(n)

    def driver_version(self) -> str:
        v = self.nvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    def memory_info(self, index: int) -> tuple[int, int, int]:
        h = self._h(index)
        v2 = getattr(self.nvml, "nvmlMemory_v2", None)
        try:
            m = (
                self.nvml.nvmlDeviceGetMemoryInfo(h, version=v2)
                if v2 is not None
                else self.nvml.nvmlDeviceGetMemoryInfo(h)
            )
        except Exception:  # older drivers lack _v2
            m = self.nvml.nvmlDeviceGetMemoryInfo(h)
        self.reserved[index] = int(getattr(m, "reserved", 0) or 0)
        return int(m.total), int(m.used), int(m.free)

    def utilization(self, index: int) -> float | None:
        try:
            return float(self.nvml.nvmlDeviceGetUtilizationRates(self._h(index)).gpu)
        except Exception:
            return None

    def processes(self, index: int) -> list[tuple[int, int, str]]:
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self._h(index))
        except Exception:
            return []
        out = []
        for p in procs:
            used = p.usedGpuMemory
            out.append((int(p.pid), 0 if used in (None, _NA) else int(used), ""))
        return out

    def xid_events(self) -> list[tuple[int, int]]:
        """(gpu index, Xid) seen since the last call; empty when the driver does not allow events."""
        n = self.nvml
        try:
            if self._events is None:
                self._events = n.nvmlEventSetCreate()
                for i in range(self.device_count()):
                    n.nvmlDeviceRegisterEvents(self._h(i), n.nvmlEventTypeXidCriticalError, self._events)
            out: list[tuple[int, int]] = []
            while True:
                try:
                    data = n.nvmlEventSetWait_v2(self._events, 0)
                except Exception:  # NVML_ERROR_TIMEOUT: nothing pending
                    return out
                idx = 0
                try:
                    idx = int(n.nvmlDeviceGetIndex(data.device))
                except Exception:
                    pass
                out.append((idx, int(data.eventData)))
        except Exception:
            return []

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


class GpuSampler(Sampler):
    """Memory per device (and per process) from any ``Devices``: NVML or the sim's ledger."""

    def __init__(self, devices: Devices | None = None, source: str = "gpu", nvml: Any = None) -> None:
        self.source = source
        self._devices = devices
        self._nvml = nvml

    async def open(self) -> None:
        if self._devices is None:
            self._devices = NvmlDevices(self._nvml)
        if self._devices.device_count() == 0:
            raise SourceUnavailable("no GPU")

    def read(self) -> list[Sample]:
        d = self._devices
        assert d is not None
        now = time.perf_counter()
        out: list[Sample] = []
        for i in range(d.device_count()):
            lab = {"gpu": str(i)}
            total, used, _free = d.memory_info(i)
            out += [
                Sample(self.source, "gpu.memory_used_bytes", used, now, lab),
                Sample(self.source, "gpu.memory_total_bytes", total, now, lab),
                Sample(self.source, "gpu.memory_share", used / total if total else 0.0, now, lab),
            ]
            reserved = getattr(d, "reserved", {}).get(i)
            if reserved:
                out.append(Sample(self.source, "gpu.memory_reserved_bytes", reserved, now, lab))
            util = d.utilization(i) if hasattr(d, "utilization") else None
            if util is not None:
                out.append(Sample(self.source, "gpu.utilization_perc", util, now, lab))
            for pid, pbytes, pname in d.processes(i):
                out.append(
                    Sample(
                        self.source,
                        "gpu.process_memory_bytes",
                        pbytes,
                        now,
                        {**lab, "pid": str(pid), **({"process": pname} if pname else {})},
                    )
                )
        if hasattr(d, "xid_events"):
            for idx, xid in d.xid_events():
                out.append(Sample(self.source, "gpu.xid", xid, now, {"gpu": str(idx)}))
        return out

    async def sample(self) -> list[Sample]:
        # NVML and the ledger file are quick local reads; a thread keeps a slow driver off the event loop.
        return await asyncio.to_thread(self.read)

    async def close(self) -> None:
        if isinstance(self._devices, NvmlDevices):
            self._devices.close()
