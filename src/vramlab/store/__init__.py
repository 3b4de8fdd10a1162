"""The run store: SQLite (default, WAL) or PostgreSQL, schema migrated on open.

    from vramlab.store import open_store
    store = open_store()                       # $VRAMLAB_DB, else ./vramlab.db
    store = open_store("postgresql://vramlab@localhost/vramlab")

SQLAlchemy is imported when a store is opened, not when this package is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vramlab.store.url import DEFAULT_PATH, ENV_VAR, describe_url, resolve_url

if TYPE_CHECKING:
    from vramlab.store.sql import SqlStore


def open_store(url: str | None = None) -> SqlStore:
    """Open (creating or migrating) the store at *url*; see `resolve_url` for the defaults."""
    from vramlab.store.sql import SqlStore

    return SqlStore(resolve_url(url))


def __getattr__(name: str) -> object:
    if name == "SqlStore":
        from vramlab.store.sql import SqlStore

        return SqlStore
    raise AttributeError(name)


__all__ = ["DEFAULT_PATH", "ENV_VAR", "SqlStore", "describe_url", "open_store", "resolve_url"]
