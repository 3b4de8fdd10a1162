"""Fixtures shared by every test file: the store backends (tests/_store_backends.py).

pytest finds fixtures here without an import, so no test file imports a fixture it never names.
"""

from __future__ import annotations

from _store_backends import any_store_url_fixture, store_url_fixture

__all__ = ["any_store_url_fixture", "store_url_fixture"]
