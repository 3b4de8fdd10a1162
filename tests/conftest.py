"""Fixtures shared by every test file: the store backends (tests/_store_backends.py).

pytest finds fixtures here without an import, so no test file imports a fixture it never names.

Test tiers: the tests listed in tests/slow_tests.txt (measured, over 2 s each) are marked `slow`
beside those marked in their files, so `scripts/test --quick` (`-m "not slow"`) runs the unit and
contract tests in a few minutes and the full suite runs everything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _store_backends import any_store_url_fixture, store_url_fixture

__all__ = ["any_store_url_fixture", "store_url_fixture"]

_SLOW = {line.strip() for line in (Path(__file__).parent / "slow_tests.txt").read_text().splitlines()
         if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.split("[", 1)[0] in _SLOW:
            item.add_marker(pytest.mark.slow)
