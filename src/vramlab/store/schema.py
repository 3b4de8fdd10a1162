"""The stored tables, one per record kind in `vramlab.records`.

Columns mirror the record fields one to one so a row round-trips without translation; lists and
dicts live in JSON columns. Rows of a run are found by `run_id` (indexed); `seq` keeps insertion
order, which is the order the runner produced them in.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("applied_at", sa.Double, nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.String(16), primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("plan", sa.JSON, nullable=False),
    sa.Column("plan_hash", sa.String(64), nullable=False),
    sa.Column("fixed", sa.JSON, nullable=False),
    sa.Column("target", sa.JSON, nullable=False),
    sa.Column("change", sa.JSON, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("ended_at", sa.Double),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("stop_reason", sa.Text),
    sa.Column("notes", sa.JSON, nullable=False),
    # Store-only (migration 2), not part of RunRecord: the writer's liveness, so a run whose process
    # died is told from one still going. heartbeat_at is epoch seconds, stamped every few seconds.
    sa.Column("heartbeat_at", sa.Double),
    sa.Column("writer_pid", sa.Integer),
    sa.Column("writer_host", sa.String(255)),
    sa.Index("ix_runs_started_at", "started_at"),
)

# Columns of `runs` that the store keeps beside the RunRecord fields.
LIVENESS_COLUMNS = ("heartbeat_at", "writer_pid", "writer_host")

requests = sa.Table(
    "requests",
    metadata,
    sa.Column(
        "seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    sa.Column("run_id", sa.String(16), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("phase", sa.String(32), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("step_value", sa.Double),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("scheduled_s", sa.Double),
    sa.Column("sent_s", sa.Double),
    sa.Column("first_token_s", sa.Double),
    sa.Column("end_s", sa.Double),
    sa.Column("ttft_ms", sa.Double),
    sa.Column("tpot_ms", sa.Double),
    sa.Column("e2e_ms", sa.Double),
    sa.Column("e2e_from_scheduled_ms", sa.Double),
    sa.Column("ttft_from_scheduled_ms", sa.Double),
    sa.Column("dispatch_lag_ms", sa.Double),
    sa.Column("itl_ms", sa.JSON, nullable=False),
    sa.Column("itl_untimed_gaps", sa.Integer),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("prompt_tokens_source", sa.String(16)),
    sa.Column("output_tokens", sa.Integer),
    sa.Column("output_tokens_source", sa.String(16)),
    sa.Column("reasoning_tokens", sa.Integer),
    sa.Column("status_code", sa.Integer, nullable=False),
    sa.Column("error_class", sa.String(32)),
    sa.Column("error", sa.Text),
    sa.Column("cached_tokens", sa.Integer),
    sa.Column("conversation", sa.String(64)),
    sa.Column("turn", sa.Integer),
    sa.Column("tenant", sa.String(64)),
    sa.Index("ix_requests_run", "run_id", "seq"),
)

samples = sa.Table(
    "samples",
    metadata,
    sa.Column(
        "seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    sa.Column("run_id", sa.String(16), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    sa.Column("t_s", sa.Double, nullable=False),
    sa.Column("source", sa.String(32), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("value", sa.Double, nullable=False),
    sa.Column("labels", sa.JSON, nullable=False),
    sa.Index("ix_samples_run", "run_id", "source", "t_s"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column(
        "seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    sa.Column("run_id", sa.String(16), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    sa.Column("t_s", sa.Double, nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("round", sa.Integer),
    sa.Column("phase", sa.String(32)),
    sa.Column("step", sa.Integer),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Index("ix_events_run", "run_id", "t_s"),
)

# The tables a run's rows live in, in the order they are copied or deleted.
RUN_TABLES = (requests, samples, events)
