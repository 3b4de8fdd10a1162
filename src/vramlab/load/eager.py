"""A task whose first step runs at once, in its caller, as Python 3.12's eager tasks do (3.11 has none).

The open loop wakes at a request's scheduled time and starts it: as an ordinary task, its first
step (encode, take a connection, send) waits for the event loop's next turn, behind every callback
ready by then; on a loaded client that turn is most of the send's lag from its schedule. Run eagerly,
the request is on the wire before the open loop gives the loop back. The first step runs in the
caller's task (``asyncio.current_task()`` is the caller's there: nothing on the send path asks).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


def eager_task(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run ``coro`` up to its first suspension now; a task drives the rest. A coroutine that ends
    in that first step gives a future already done with its result or exception."""
    try:
        first = coro.send(None)
    except StopIteration as stop:
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        done.set_result(stop.value)
        return done
    except Exception as exc:
        failed: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        failed.set_exception(exc)
        return failed
    return asyncio.ensure_future(_resume(coro, first))


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    """Hand the task what ``coro`` yielded (the future it waits on), and ``coro`` what the task sends
    or throws back, until it returns."""
    while True:
        try:
            value = yield yielded
        except BaseException as exc:  # cancellation, and GeneratorExit when the task is closed
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                yielded = coro.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


__all__ = ["eager_task"]
