"""`vramlab sim serve` as a process: serve until a signal or until the engine dies, then exit like it."""

from __future__ import annotations

import asyncio
import signal

from vramlab.errors import ConfigError
from vramlab.sim.config import SimConfig
from vramlab.sim.engine import StartupRefused
from vramlab.sim.server import SimServer


async def serve_forever(cfg: SimConfig) -> int:
    """The process exit code: 0 after SIGTERM/SIGINT, the engine's code after it died or refused."""
    srv = SimServer(cfg)
    try:
        await srv.start()
    except StartupRefused as refused:
        return refused.exit_code
    except ConfigError:  # it could not listen: release what start() took (the ledger, the runner)
        await srv.stop()
        raise
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    died = asyncio.create_task(srv.wait_exit())
    stopped = asyncio.create_task(stop.wait())
    done, pending = await asyncio.wait({died, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    code = died.result() if died in done else 0
    await srv.stop()
    return code
