"""Rollback commands: shell commands run in order after every run, however it ended.

Each runs in its own process group with a timeout (the whole group is killed when it expires),
and gets VRAMLAB_RUN_ID, VRAMLAB_RUN_STATUS and VRAMLAB_STOP_REASON in its environment. A failing
rollback does not stop the next one: every command gets its chance to restore the target.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vramlab.plandoc import RollbackCommand


@dataclass(frozen=True)
class RollbackResult:
    command: str
    exit_code: int | None  # None: it timed out and was killed
    duration_s: float
    output_tail: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


async def run_rollbacks(
    commands: Sequence[RollbackCommand],
    env: dict[str, str],
    on_result: Callable[[RollbackResult], None] | None = None,
) -> list[RollbackResult]:
    out = []
    for cmd in commands:
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_shell(
            cmd.run,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, **env},
            start_new_session=True,
        )
        try:
            stdout, _ = await asyncio.wait_for(proc.communicate(), timeout=cmd.timeout_s)
            code: int | None = proc.returncode
        except asyncio.TimeoutError:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            stdout, _ = await proc.communicate()
            code = None
        tail = (stdout or b"").decode(errors="replace").strip()[-500:]
        res = RollbackResult(cmd.run, code, time.monotonic() - t0, tail)
        out.append(res)
        if on_result is not None:
            on_result(res)
    return out
