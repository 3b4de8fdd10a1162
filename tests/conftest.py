"""Fixtures shared by every test file: the store backends (tests/_store_backends.py).

pytest finds fixtures here without an import, so no test file imports a fixture it never names.

Test tiers: the tests listed in tests/slow_tests.txt (measured, over 2 s each) are marked `slow`
beside those marked in their files, so `scripts/test --quick` (`-m "not slow"`) runs the unit and
contract tests in a few minutes and the full suite runs everything.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from _store_backends import any_store_url_fixture, store_url_fixture

__all__ = ["any_store_url_fixture", "store_url_fixture"]

# every event a run writes, in this process or a vramlab it starts, is checked against its kind's declared
# data types as it is written (run/runner.py): a writer whose payload drifts fails where it writes
os.environ["VRAMLAB_STRICT_EVENTS"] = "1"

# No per-example deadline: properties here are checked for correctness, never speed, and a busy
# two-core machine once stretched a 0.3 ms example to 298 ms (hypothesis then calls the test flaky).
# A test's own @settings(...) still applies on top.
settings.register_profile("vramlab", deadline=None)
settings.load_profile("vramlab")

_SLOW = {
    line.strip()
    for line in (Path(__file__).parent / "slow_tests.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


# The longest files go first: pytest-xdist (--dist loadfile) hands files out in collection order,
# so the real engines' files, alphabetically near the end, started last and ran alone on one worker
# for minutes while the other sat idle (a CI-style run spent its last 4 % of tests, ~6 minutes, so).
_FIRST = ("tests/test_vllm_e2e.py", "tests/test_llamacpp_e2e.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.split("[", 1)[0] in _SLOW:
            item.add_marker(pytest.mark.slow)
    rank = {path: i for i, path in enumerate(_FIRST)}
    items.sort(
        key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(_FIRST))
    )  # stable: the rest in order


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


# The real engines' test files: the summary says how many of their tests ran, and why the others skipped
# (scripts/test installs the engines; where one cannot install, its tests skip with the reason).
_ENGINE_FILES = {"tests/test_llamacpp_e2e.py": "llama.cpp", "tests/test_vllm_e2e.py": "vLLM"}


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    outcome: dict[str, tuple[str, str]] = {}  # nodeid -> (outcome, skip reason)
    for kind in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for rep in terminalreporter.stats.get(kind, []):
            nodeid = getattr(rep, "nodeid", "")
            if nodeid.split("::", 1)[0] not in _ENGINE_FILES:
                continue
            reason = ""
            if kind == "skipped" and isinstance(getattr(rep, "longrepr", None), tuple):
                reason = str(rep.longrepr[2]).removeprefix("Skipped: ")
            if nodeid not in outcome or kind in ("failed", "error"):
                outcome[nodeid] = (kind, reason)
    for path, engine in _ENGINE_FILES.items():
        mine = [v for k, v in outcome.items() if k.startswith(path + "::")]
        if not mine:
            continue
        ran = [k for k, _ in mine if k != "skipped"]
        skipped = [r for k, r in mine if k == "skipped"]
        line = f"real engine {engine}: {len(ran)} of {len(mine)} tests ran"
        if skipped:
            line += f"; {len(skipped)} skipped: {skipped[0]}"
        terminalreporter.write_line(line)
