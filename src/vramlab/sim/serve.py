"""`vramlab sim serve` as a process: serve until a signal or until the engine dies, then exit like it."""

from __future__ import annotations

import asyncio
import signal

from vramlab.errors import ConfigError
from vramlab.sim.config import SimConfig
from vramlab.sim.engine import StartupRefused
from vramlab.sim.server import SimServer


def _one_line_protocol_errors() -> None:
    """aiohttp logs a malformed request (bad framing, too many headers, no Host) with a traceback
    ("Error handling request"): the client's mistake, said in one line. A handler's own exception
    (a bug in the sim) keeps its traceback."""
    import logging

    from aiohttp.http_exceptions import HttpProcessingError

    class OneLine(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            exc = record.exc_info[1] if record.exc_info else None
            if isinstance(exc, HttpProcessingError):
                why = " ".join(str(exc).split())[:200]
                record.msg, record.args = f"{record.getMessage()}: {type(exc).__name__}: {why}", None
                record.exc_info, record.exc_text = None, None
            return True

    logging.getLogger("aiohttp.server").addFilter(OneLine())


async def serve_forever(cfg: SimConfig) -> int:
    """The process exit code: 0 after SIGTERM/SIGINT, the engine's code after it died or refused."""
    _one_line_protocol_errors()
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
