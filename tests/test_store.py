"""The `Store` contract on every implementation (SQLite, PostgreSQL, in memory): round-trips, prefix
lookup, listing, updates; and the SQL store's own migrations and URLs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from _store_backends import MEMORY_URL
from vramlab.errors import ConfigError, NotFoundError, VramlabError
from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
from vramlab.records.memory import MemoryStore
from vramlab.records.store import Store
from vramlab.store import describe_url, open_store, resolve_url
from vramlab.store.migrations import LATEST


@pytest.fixture()
def open_any(any_store_url):
    """Opens the store under test; the in-memory one "reopens" as the same object, as a file would."""
    if any_store_url == MEMORY_URL:
        mem = MemoryStore()
        return lambda: mem
    return lambda: open_store(any_store_url)


def test_every_implementation_is_a_store(open_any):
    with open_any() as store:
        assert isinstance(store, Store)


def _run(run_id: str, started_at: float = 1_700_000_000.0, kind: str = "experiment") -> RunRecord:
    return RunRecord(
        run_id=run_id,
        kind=kind,
        name=f"plan-{run_id}",
        plan={"name": "p", "rounds": 3, "change": {"variable": "concurrency", "steps": [1, 2, 4]}},
        plan_hash="ab" * 32,
        fixed={
            "engine": "vllm",
            "engine_version": "0.8.5",
            "model": "m",
            "gpu_name": "NVIDIA H100 80GB HBM3",
        },
        target={"base_url": "http://127.0.0.1:8000", "api": "openai", "environment": "test"},
        change={"variable": "concurrency", "steps": [1, 2, 4]},
        started_at=started_at,
        notes=["no NVML on this host: GPU samples missing"],
    )


def test_round_trip_every_record_kind(open_any):
    with open_any() as store:
        run = store.create_run(_run("0a1b2c3d"))
        reqs = [
            RequestRecord(
                run_id=run.run_id,
                round=r,
                phase="treatment",
                step=2,
                step_value=4.0,
                request_id=f"r{r}-{i}",
                attempt=i % 2,
                scheduled_s=0.5 * i,
                sent_s=0.5 * i + 0.001,
                first_token_s=0.5 * i + 0.04,
                end_s=0.5 * i + 0.3,
                ttft_ms=39.0,
                tpot_ms=12.25,
                e2e_ms=299.0,
                e2e_from_scheduled_ms=300.0,
                ttft_from_scheduled_ms=40.0,
                dispatch_lag_ms=1.0,
                itl_ms=[12.0, 12.5],
                prompt_tokens=128,
                output_tokens=3,
                status_code=200 if i else 503,
                error_class=None if i else "http_5xx",
                error=None if i else "503 Service Unavailable",
            )
            for r in range(3)
            for i in range(4)
        ]
        samples = [
            SampleRecord(
                run_id=run.run_id,
                t_s=0.25 * i,
                source="gpu",
                name="gpu.memory_used_bytes",
                value=float(70 * 2**30 + i),
                labels={"gpu": "0"},
            )
            for i in range(5)
        ] + [
            SampleRecord(
                run_id=run.run_id, t_s=0.1, source="engine", name="engine.kv_cache_usage_perc", value=0.5
            )
        ]
        events = [
            EventRecord(run_id=run.run_id, t_s=0.0, kind="run_start", message="start"),
            EventRecord(
                run_id=run.run_id,
                t_s=3.5,
                kind="stop_condition",
                round=1,
                phase="treatment",
                step=2,
                message="P95 TTFT 2300 ms > 2000 ms",
                data={"metric": "ttft_p95_ms", "value": 2300.0},
            ),
        ]
        assert store.add_requests(run.run_id, reqs) == 12
        assert store.add_samples(run.run_id, samples) == 6
        assert store.add_events(run.run_id, list(reversed(events))) == 2

    # A fresh connection sees exactly what was written.
    with open_any() as store:
        assert store.get_run("0a1b2c3d") == run
        assert store.requests(run.run_id) == reqs
        assert store.samples(run.run_id) == sorted(samples, key=lambda s: s.t_s)
        assert store.samples(run.run_id, source="engine") == samples[-1:]
        assert store.events(run.run_id) == events  # ordered by time, not insertion
        assert store.requests("ffffffff") == []


def test_prefix_lookup(open_any):
    with open_any() as store:
        for rid in ("abc12345", "abc19999", "def00000"):
            store.create_run(_run(rid))
        assert store.get_run("abc12").run_id == "abc12345"
        assert store.get_run("DEF").run_id == "def00000"
        with pytest.raises(NotFoundError, match="ambiguous: abc12345, abc19999"):
            store.get_run("abc1")
        with pytest.raises(NotFoundError, match="no run '0123'"):
            store.get_run("0123")
        with pytest.raises(NotFoundError, match="hex"):
            store.get_run("abc%")  # a LIKE wildcard must not match everything
        with pytest.raises(NotFoundError):
            store.get_run("")
        with pytest.raises(VramlabError, match="already exists"):
            store.create_run(_run("abc12345"))


def test_list_runs_newest_first_with_limit_and_kind(open_any):
    with open_any() as store:
        for i, rid in enumerate(["00000001", "00000002", "00000003", "00000004"]):
            store.create_run(_run(rid, started_at=1000.0 + i, kind="drill" if i % 2 else "experiment"))
        assert [r.run_id for r in store.list_runs()] == ["00000004", "00000003", "00000002", "00000001"]
        assert [r.run_id for r in store.list_runs(limit=2)] == ["00000004", "00000003"]
        assert [r.run_id for r in store.list_runs(kind="drill")] == ["00000004", "00000002"]


def test_update_run_validates(open_any):
    with open_any() as store:
        store.create_run(_run("11112222"))
        updated = store.update_run(
            "11112222",
            status="stopped",
            ended_at=1_700_000_060.5,
            stop_reason="P95 over 2 s",
            notes=["a", "b"],
        )
        assert updated.status == "stopped"
        got = store.get_run("11112222")
        assert (got.status, got.ended_at, got.stop_reason, got.notes) == (
            "stopped",
            1_700_000_060.5,
            "P95 over 2 s",
            ["a", "b"],
        )
        with pytest.raises(ValidationError):
            store.update_run("11112222", status="exploded")
        with pytest.raises(ValueError, match="colour"):
            store.update_run("11112222", colour="red")
        with pytest.raises(NotFoundError):
            store.update_run("99999999", status="completed")
        assert store.get_run("11112222").status == "stopped"


def test_batch_for_wrong_run_writes_nothing(open_any):
    with open_any() as store:
        store.create_run(_run("aaaa0000"))
        good = RequestRecord(run_id="aaaa0000", round=0, phase="baseline", request_id="1", status_code=200)
        bad = RequestRecord(run_id="bbbb0000", round=0, phase="baseline", request_id="2", status_code=200)
        with pytest.raises(ValueError):
            store.add_requests("aaaa0000", [good, bad])
        assert store.requests("aaaa0000") == []


def test_schema_version_and_newer_database_refused(store_url):
    import sqlalchemy as sa

    with open_store(store_url) as store:
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version FROM schema_version")).scalars().all() == list(
                range(1, LATEST + 1)
            )
    with open_store(store_url) as store:  # reopening does not re-apply
        with store.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM schema_version")).scalar() == LATEST
            conn.execute(sa.text("INSERT INTO schema_version (version, applied_at) VALUES (99, 0)"))
    with pytest.raises(VramlabError, match="schema version 99"):
        open_store(store_url)


def test_a_version_1_database_gains_the_token_accounting_columns(tmp_path):
    """A store written before the token-accounting migration (no output_tokens_source / reasoning_tokens) is
    migrated in place, and its old rows read back with the new fields empty."""
    import sqlalchemy as sa

    from vramlab.records import RequestRecord
    from vramlab.store import schema

    url = f"sqlite:///{tmp_path}/v1.db"
    engine = sa.create_engine(url)
    v1 = sa.MetaData()
    for t in (schema.schema_version, schema.runs, *schema.RUN_TABLES):
        cols = [
            sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in t.columns
            if c.name not in ("output_tokens_source", "reasoning_tokens", "itl_untimed_gaps")
        ]
        sa.Table(t.name, v1, *cols)
    v1.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO schema_version (version, applied_at) VALUES (1, 0)"))
    engine.dispose()
    with open_store(url) as store:
        store.create_run(RunRecord(run_id="0123abcd", name="old", started_at=1.0))
        rec = RequestRecord(
            run_id="0123abcd",
            round=1,
            phase="baseline",
            request_id="r0",
            status_code=200,
            output_tokens=7,
            output_tokens_source="chunks",
            reasoning_tokens=3,
        )
        store.add_requests("0123abcd", [rec])
        assert store.requests("0123abcd") == [rec]


def test_resolve_url(tmp_path, monkeypatch):
    monkeypatch.delenv("VRAMLAB_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_url() == "sqlite:///vramlab.db"
    monkeypatch.setenv("VRAMLAB_DB", str(tmp_path / "a" / "b" / "x.db"))
    assert resolve_url() == f"sqlite:///{tmp_path}/a/b/x.db"
    assert (tmp_path / "a" / "b").is_dir()
    assert resolve_url("postgres://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert resolve_url("postgresql://u@h:5/db") == "postgresql+psycopg://u@h:5/db"
    with pytest.raises(ConfigError, match="mysql"):
        resolve_url("mysql://x/y")
    with pytest.raises(ConfigError):
        resolve_url("sqlite:///:memory:")
    assert describe_url("postgresql+psycopg://u:secret@h/db") == "postgresql+psycopg://u:***@h/db"


def test_unreachable_postgres_is_one_clear_error():
    with pytest.raises(VramlabError) as info:
        open_store("postgresql://vramlab:hunter2@127.0.0.1:1/nope")
    msg = str(info.value)
    assert "cannot open the store" in msg and "hunter2" not in msg and "\n" not in msg


def test_migration_2_adds_the_heartbeat_to_a_version_1_database(tmp_path):
    """A store written before heartbeats: runs without the liveness columns, schema version 1."""
    import sqlite3
    import time

    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at FLOAT NOT NULL);
        INSERT INTO schema_version VALUES (1, 0);
        CREATE TABLE runs (run_id VARCHAR(16) PRIMARY KEY, kind VARCHAR(32) NOT NULL, name TEXT NOT NULL,
            plan JSON NOT NULL, plan_hash VARCHAR(64) NOT NULL, fixed JSON NOT NULL, target JSON NOT NULL,
            change JSON NOT NULL, started_at FLOAT NOT NULL, ended_at FLOAT, status VARCHAR(32) NOT NULL,
            stop_reason TEXT, notes JSON NOT NULL);
        INSERT INTO runs VALUES ('abcd0123', 'experiment', 'old', '{}', '', '{}', '{}', '{}', 1.0, NULL,
            'running', NULL, '[]');
    """)
    con.commit()
    con.close()
    with open_store(str(path)) as store:
        assert store.get_run("abcd0123").status == "running"
        assert store.liveness(["abcd0123"]) == {"abcd0123": (None, None, None)}
        store.heartbeat("abcd0123")
        beat, pid, host = store.liveness(["abcd0123"])["abcd0123"]
        assert beat is not None and abs(beat - time.time()) < 60 and pid == __import__("os").getpid() and host


def test_memory_store_hands_out_copies_and_refuses_rows_of_unknown_runs():
    store = MemoryStore()
    run = store.create_run(_run("0a1b2c3d"))
    run.notes.append("changed after writing")
    req = RequestRecord(
        run_id=run.run_id, round=0, phase="baseline", request_id="1", status_code=200, itl_ms=[1.0]
    )
    store.add_requests(run.run_id, [req])
    req.itl_ms.append(2.0)
    store.requests(run.run_id)[0].itl_ms.append(3.0)
    assert store.get_run(run.run_id).notes == ["no NVML on this host: GPU samples missing"]
    assert store.requests(run.run_id)[0].itl_ms == [1.0]
    with pytest.raises(NotFoundError):
        store.add_events("ffff0000", [EventRecord(run_id="ffff0000", t_s=0, kind="note")])


def test_migration_7_names_the_plan_field_of_an_old_drills_rounds_warning(store_url):
    """Drills stored before WarningData.plan_field wrote the too-few-rounds warning as text only; the
    migration gives their rows the field (the report tells the warning by it), and nothing else."""
    import sqlalchemy as sa

    from vramlab.store.url import resolve_url as full_url

    text = "rounds: 1 is fewer than 3; a one-off cannot be told from a trend"
    with open_store(store_url) as store:
        for rid, kind in (("0000d011", "drill"), ("0000e011", "experiment")):
            store.create_run(RunRecord(run_id=rid, name=kind, kind=kind, started_at=1.0))
            store.add_events(
                rid,
                [
                    EventRecord(run_id=rid, t_s=0.0, kind="warning", message=text, data={}),
                    EventRecord(
                        run_id=rid, t_s=0.1, kind="warning", message="rounds of tea", data={"pid": 7}
                    ),
                ],
            )
    engine = sa.create_engine(full_url(store_url))
    with engine.begin() as conn:  # back to version 6, as a store written before this release
        conn.execute(sa.text("DELETE FROM schema_version WHERE version = 7"))
    engine.dispose()
    with open_store(store_url) as store:
        drill = {e.message: e.data for e in store.events("0000d011")}
        other = {e.message: e.data for e in store.events("0000e011")}
    assert drill == {text: {"plan_field": "rounds"}, "rounds of tea": {"pid": 7}}
    assert other == {text: {}, "rounds of tea": {"pid": 7}}  # an experiment's rows are left as they are
