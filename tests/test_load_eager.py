"""load/eager.py: a task whose first step runs in its caller (the open loop's sends go out before the
loop turns), and that otherwise behaves as a task: result, exception, cancellation, finally blocks."""

from __future__ import annotations

import asyncio

import pytest

from vramlab.load.eager import eager_task


def test_the_first_step_runs_before_the_caller_yields() -> None:
    async def go() -> tuple[list[str], list[str], int]:
        seen: list[str] = []

        async def job(name: str) -> int:
            seen.append(f"{name} started")
            await asyncio.sleep(0.01)
            seen.append(f"{name} resumed")
            return 7

        plain = asyncio.ensure_future(job("plain"))
        eager = eager_task(job("eager"))
        at_spawn = list(seen)  # nothing has yielded to the loop yet
        return at_spawn, seen, (await eager) + (await plain)

    at_spawn, seen, total = asyncio.run(go())
    assert at_spawn == ["eager started"]  # the plain task waits for the loop's next turn
    assert total == 14 and "eager resumed" in seen and "plain started" in seen


def test_a_coroutine_that_ends_in_its_first_step_is_a_done_future() -> None:
    async def go() -> tuple[bool, int, bool]:
        async def quick() -> int:
            return 3

        async def broken() -> int:
            raise ValueError("bad")

        ok, bad = eager_task(quick()), eager_task(broken())
        done_now = ok.done() and bad.done()
        with pytest.raises(ValueError, match="bad"):
            await bad
        return done_now, await ok, isinstance(ok, asyncio.Future)

    assert asyncio.run(go()) == (True, 3, True)


def test_cancellation_reaches_the_coroutine_and_its_finally_runs() -> None:
    async def go() -> tuple[list[str], bool]:
        log: list[str] = []

        async def job() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                log.append("cancelled inside")
                raise
            finally:
                log.append("finally")

        t = eager_task(job())
        await asyncio.sleep(0.01)
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        return log, t.cancelled()

    assert asyncio.run(go()) == (["cancelled inside", "finally"], True)


def test_values_and_exceptions_pass_through_every_later_step() -> None:
    async def go() -> list[object]:
        got: list[object] = []
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        bad: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def job() -> str:
            got.append(await fut)  # a value sent in
            try:
                await bad
            except KeyError as exc:  # an exception thrown in
                got.append(repr(exc))
            await asyncio.sleep(0)  # a bare yield
            return "end"

        t = eager_task(job())
        fut.set_result("v")
        await asyncio.sleep(0.01)
        bad.set_exception(KeyError("k"))
        got.append(await t)
        return got

    assert asyncio.run(go()) == ["v", "KeyError('k')", "end"]
