"""Schema migrations: numbered functions applied in order, each in its own transaction.

`schema_version` holds one row per applied migration. A database written by a newer vramlab
(a version above the last one known here) is refused rather than guessed at.

Adding a migration: append a function that takes a Connection and changes the schema from the
previous version (ALTER TABLE ..., new tables); never edit an applied one. Migration 1 creates
the version-1 tables from `schema.py`; when a later migration changes a table, freeze the
version-1 definition here first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from vramlab.errors import VramlabError
from vramlab.store import schema


def _m1_initial(conn: sa.Connection) -> None:
    schema.metadata.create_all(conn, tables=[schema.runs, *schema.RUN_TABLES])


def _m2_heartbeat(conn: sa.Connection) -> None:
    """runs.heartbeat_at / writer_pid / writer_host. A database created by migration 1 of this
    release already has them (migration 1 creates the current `runs`), so add only what is missing."""
    have = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
    types: dict[str, sa.types.TypeEngine[Any]] = {
        "heartbeat_at": sa.Double(),
        "writer_pid": sa.Integer(),
        "writer_host": sa.String(255),
    }
    for name in schema.LIVENESS_COLUMNS:
        if name not in have:
            ddl = types[name].compile(dialect=conn.dialect)
            conn.execute(sa.text(f"ALTER TABLE runs ADD COLUMN {name} {ddl}"))


def _add_missing_columns(conn: sa.Connection, table: sa.Table, names: tuple[str, ...]) -> None:
    """ALTER TABLE ... ADD COLUMN for those of ``names`` the table lacks (a database made by
    migration 1 of a newer vramlab already has them: migration 1 creates today's tables)."""
    if not sa.inspect(conn).has_table(table.name):  # a partial old database: the table as it is now
        schema.metadata.create_all(conn, tables=[table])
        return
    have = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    for name in names:
        if name not in have:
            col = table.c[name]
            conn.execute(
                sa.text(
                    f'ALTER TABLE {table.name} ADD COLUMN "{name}" {col.type.compile(dialect=conn.dialect)}'
                )
            )


def _m3_token_accounting(conn: sa.Connection) -> None:
    # Output tokens' source (usage, or counted chunks: an estimate) and reasoning tokens.
    _add_missing_columns(conn, schema.requests, ("output_tokens_source", "reasoning_tokens"))


def _m4_itl_untimed_gaps(conn: sa.Connection) -> None:
    # How many inter-token gaps of a request could not be timed; older rows read None (unknown).
    _add_missing_columns(conn, schema.requests, ("itl_untimed_gaps",))


def _m5_prompt_tokens_source(conn: sa.Connection) -> None:
    # Where a request's prompt token count came from (usage, the target's tokenizer, an estimate).
    _add_missing_columns(conn, schema.requests, ("prompt_tokens_source",))


def _m6_traffic(conn: sa.Connection) -> None:
    # The prefix cache's share of a request's prompt in the engine's words, and a conversation
    # workload's conversation, turn and tenant; older rows read None (not said, not a conversation).
    _add_missing_columns(conn, schema.requests, ("cached_tokens", "conversation", "turn", "tenant"))


def _m7_warning_plan_field(conn: sa.Connection) -> None:
    # A drill's too-few-rounds warning says which plan field it is about (WarningData.plan_field),
    # and the report tells it by that field, not by its text. Drills stored before wrote only the
    # text, "rounds: N is fewer than 3; ...": their rows get the field once, here, so an old report
    # still says it once.
    ev, runs = schema.events, schema.runs
    if not sa.inspect(conn).has_table(ev.name):  # a partial old database: no events to name
        return
    rows = conn.execute(
        sa.select(ev.c.seq, ev.c.data)
        .select_from(ev.join(runs, ev.c.run_id == runs.c.run_id))
        .where(runs.c.kind == "drill", ev.c.kind == "warning", ev.c.message.like("rounds: %"))
    ).all()
    for seq, data in rows:
        if isinstance(data, dict) and "plan_field" not in data:
            conn.execute(sa.update(ev).where(ev.c.seq == seq).values(data={**data, "plan_field": "rounds"}))


MIGRATIONS: list[Callable[[sa.Connection], None]] = [
    _m1_initial,
    _m2_heartbeat,
    _m3_token_accounting,
    _m4_itl_untimed_gaps,
    _m5_prompt_tokens_source,
    _m6_traffic,
    _m7_warning_plan_field,
]
LATEST = len(MIGRATIONS)


def current_version(conn: sa.Connection) -> int:
    row = conn.execute(sa.select(sa.func.max(schema.schema_version.c.version))).scalar()
    return int(row or 0)


def migrate(engine: sa.Engine) -> int:
    """Bring the database to LATEST; returns the version it was at before."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Two processes opening a fresh database at once must not both create the tables.
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(7261001)"))
        schema.metadata.create_all(conn, tables=[schema.schema_version])
        before = current_version(conn)
        if before > LATEST:
            raise VramlabError(
                f"the store is at schema version {before}, newer than this vramlab knows ({LATEST}); "
                "upgrade vramlab to read it"
            )
        for version in range(before + 1, LATEST + 1):
            MIGRATIONS[version - 1](conn)
            conn.execute(sa.insert(schema.schema_version).values(version=version, applied_at=time.time()))
    return before
