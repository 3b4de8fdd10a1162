"""Is a 'running' run still running? From the heartbeat the store writer stamps on its row.

A run row says ``running`` from its start until its writer records the end. A process killed
with SIGKILL (or a lost host) never records the end, so the row alone would say ``running``
forever. The writer stamps ``heartbeat_at`` (and its pid and host) every few seconds
(`vramlab.run.recorder`); a run is shown as ``died`` when its writer's process is gone
(same host) or its heartbeat is older than `STALE_S`.
"""

from __future__ import annotations

import os
import socket

STALE_S = 30.0  # the writer beats every 2 s; 15 missed beats is not a busy store, it is a dead process


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists, owned by someone else
    return True


def observed_status(
    status: str, started_at: float, heartbeat_at: float | None, pid: int | None, host: str | None, now: float
) -> str:
    """The status to show: the stored one, or ``died`` for a 'running' run whose writer is gone."""
    if status != "running":
        return status
    if pid is not None and host is not None and host == socket.gethostname()[:255] and not pid_alive(pid):
        return "died"
    last = heartbeat_at if heartbeat_at is not None else started_at
    return "died" if now - last > STALE_S else "running"
