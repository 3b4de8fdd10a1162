"""One fixture, both store backends: a SQLite file and a real PostgreSQL (VRAMLAB_TEST_PG_URL).

Each PostgreSQL test gets its own schema (search_path in the URL), dropped afterwards, so tests
never see each other's runs. Without VRAMLAB_TEST_PG_URL the PostgreSQL half skips, unless
VRAMLAB_REQUIRE_PG=1 (scripts/test sets it), where it fails.
"""

from __future__ import annotations

import os
import secrets

import pytest


def pg_url_or_skip() -> str:
    url = os.environ.get("VRAMLAB_TEST_PG_URL")
    if not url:
        if os.environ.get("VRAMLAB_REQUIRE_PG") == "1":
            pytest.fail("VRAMLAB_REQUIRE_PG=1 but VRAMLAB_TEST_PG_URL is unset")
        pytest.skip("no PostgreSQL: set VRAMLAB_TEST_PG_URL (scripts/test does)")
    return url


def _psycopg_conninfo(url: str) -> str:
    # psycopg wants postgresql://, not SQLAlchemy's postgresql+psycopg://
    return "postgresql://" + url.split("://", 1)[1]


@pytest.fixture(name="store_url", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url_fixture(request: pytest.FixtureRequest, tmp_path):
    yield from _backend_url(request.param, tmp_path)


MEMORY_URL = "memory://"


@pytest.fixture(
    name="any_store_url", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres), "memory"]
)
def any_store_url_fixture(request: pytest.FixtureRequest, tmp_path):
    """store_url plus the in-memory store (MEMORY_URL): for tests of the `Store` contract itself."""
    yield from _backend_url(request.param, tmp_path)


def _backend_url(backend: str, tmp_path):
    if backend == "memory":
        yield MEMORY_URL
        return
    if backend == "sqlite":
        yield str(tmp_path / "store" / "vramlab.db")
        return
    import psycopg

    base = pg_url_or_skip()
    schema = "t_" + secrets.token_hex(6)
    with psycopg.connect(_psycopg_conninfo(base), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_psycopg_conninfo(base), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
