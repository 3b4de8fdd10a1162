"""Fixtures shared by every test file: the store backends (tests/_store_backends.py).

pytest finds fixtures here without an import, so no test file imports a fixture it never names.

Test tiers: the tests listed in tests/slow_tests.txt (measured, over 2 s each) are marked `slow`
beside those marked in their files, so `scripts/test --quick` (`-m "not slow"`) runs the unit and
contract tests in a few minutes and the full suite runs everything.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _store_backends import any_store_url_fixture, store_url_fixture

__all__ = ["any_store_url_fixture", "store_url_fixture"]

_SLOW = {
    line.strip()
    for line in (Path(__file__).parent / "slow_tests.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.split("[", 1)[0] in _SLOW:
            item.add_marker(pytest.mark.slow)


@pytest.fixture()
def stub() -> Iterator[str]:
    """The URL of a stub OpenAI server on its own thread and event loop, for tests that run `vramlab` as a
    subprocess or a runner in the test's own loop (tests/test_store_full.py, tests/test_store_faults.py)."""
    from vramlab.load.stub import StubBehaviour, StubServer

    ready, box = threading.Event(), dict[str, Any]()

    def serve() -> None:
        async def main() -> None:
            async with StubServer(StubBehaviour()) as srv:
                box["url"], box["loop"], box["stop"] = srv.url, asyncio.get_running_loop(), asyncio.Event()
                ready.set()
                await box["stop"].wait()

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    yield str(box["url"])
    box["loop"].call_soon_threadsafe(box["stop"].set)
    t.join(5)
