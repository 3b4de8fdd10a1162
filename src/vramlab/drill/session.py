"""Run a drill in the foreground of a process, as `vramlab drill` does: a watchdog that leaves
every thread's stack on stderr if the event loop stalls past the wall clock, and SIGUSR1 printing
what every asyncio task waits on. The drill itself (and its rollback on Ctrl-C) is `DrillRunner`:
the one runner (experiment/runner.py) with the drill's parts.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlab.drill.runner import DrillResult, DrillRunner

WATCHDOG_GRACE_S = 60.0
DEFAULT_WALL_S = 300.0


def run_drill(runner: DrillRunner) -> DrillResult:
    """Run *runner* to its end. Ctrl-C raises KeyboardInterrupt after the rollback ran."""
    plan = runner.plan
    # The wall-clock stop condition runs on the event loop; if something ever blocks the loop past
    # it, leave every thread's stack on stderr so the stall can be diagnosed (the drill goes on).
    wall = (
        plan.stop.wall_clock_s if getattr(plan, "stop", None) and plan.stop.wall_clock_s else DEFAULT_WALL_S
    )
    faulthandler.dump_traceback_later(wall + WATCHDOG_GRACE_S, repeat=False, file=sys.stderr)
    return asyncio.run(_run_with_task_dump(runner))


def _dump_tasks() -> None:
    tasks = asyncio.all_tasks()
    print(f"vramlab drill: {len(tasks)} asyncio tasks", file=sys.stderr)
    for task in tasks:
        task.print_stack(limit=8, file=sys.stderr)
    sys.stderr.flush()


async def _run_with_task_dump(runner: DrillRunner) -> DrillResult:
    """Run the drill; SIGUSR1 prints what every asyncio task is waiting on (for a drill that seems stuck)."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    except (NotImplementedError, AttributeError, RuntimeError):  # not on this platform: no dump
        pass
    return await runner.run()


__all__ = ["run_drill"]
