"""A co-tenant on the simulated card: take memory, hold it, give it back; and the card's status."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

from vramlab.errors import ConfigError, VramlabError
from vramlab.sim.ledger import DeviceLedger, SimOutOfMemory
from vramlab.units import GIB
from vramlab.units import gib as gib_text


def hold(
    device: str,
    gib: float | None = None,
    leave_gib: float | None = None,
    hold_s: float | None = None,
    gpu: str | None = None,
) -> int:
    """Hold memory until *hold_s* passes or the process is interrupted or terminated; 0 when released."""
    ledger = DeviceLedger(device, gpu=gpu)
    if gib is not None:
        if gib <= 0:
            raise ConfigError("--gib must be positive")
        nbytes = int(gib * GIB)
    else:
        _, _, free = ledger.memory_info()
        nbytes = free - int((leave_gib or 0) * GIB)
        if nbytes <= 0:
            raise ConfigError(f"only {gib_text(free, unit=True)} is free; nothing to take")
    try:
        handle = ledger.allocate(nbytes, "balloon", "vramlab-balloon")
    except SimOutOfMemory as oom:
        raise VramlabError(str(oom)) from None

    def _terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    print(f"balloon: holding {gib_text(nbytes, unit=True)} on {device}; Ctrl-C releases it", flush=True)
    try:
        deadline = None if hold_s is None else time.monotonic() + hold_s
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        ledger.release(handle)
        signal.signal(signal.SIGTERM, previous)
        print("balloon: released", file=sys.stderr, flush=True)
    return 0


def device_status(device: str) -> dict[str, Any]:
    """The card as `vramlab sim status --json` prints it."""
    ledger = DeviceLedger(device)
    total, used, free = ledger.memory_info()
    procs: dict[int, dict[str, Any]] = {}
    for a in ledger.allocations():
        p = procs.setdefault(a.pid, {"pid": a.pid, "name": a.name, "used_bytes": 0, "by_kind": {}})
        p["used_bytes"] += a.bytes
        p["by_kind"][a.kind] = p["by_kind"].get(a.kind, 0) + a.bytes
    return {
        "device": str(ledger.path),
        "gpu": ledger.gpu,
        "name": ledger.name(0),
        "total_bytes": total,
        "used_bytes": used,
        "free_bytes": free,
        "processes": sorted(procs.values(), key=lambda p: p["pid"]),
    }
