"""Ended calls counted as they end (`dex_call_counts`), and the request's trace context.

`dex_call_counts` holds, per tool, effect class, terminal status and writer shard, the calls that
ended, their attempts and retries; the writes that end calls add to it in their own transaction
(`store/counts.py`), so a metrics scrape never scans the calls table (docs/operations.md,
"Metrics"). The upgrade fills it from the calls already ended (shard 0). `dex_tool_calls` gets
`trace_context`: the request's W3C trace context, so the sweeper's retries and records join the
request's trace (docs/operations.md, "Tracing").

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TERMINAL = ("succeeded", "failed", "rejected", "outcome_unknown")


def upgrade() -> None:
    op.create_table(
        "dex_call_counts",
        sa.Column("tool_name", sa.String(200), nullable=False),
        sa.Column("effect", sa.String(32), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.BigInteger(), nullable=False),
        sa.Column("retries", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tool_name", "effect", "status", "shard", name=op.f("pk_dex_call_counts")
        ),
    )
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.add_column(sa.Column("trace_context", sa.Text(), nullable=True))
    # Backfill: one grouped scan of the calls already ended, once. Named in the configured
    # schema: lightweight tables are not translated by the schema map (as ALTER TABLE is not).
    schema = table_schema()
    calls = sa.table(
        "dex_tool_calls",
        sa.column("tool_name"),
        sa.column("effect"),
        sa.column("status"),
        sa.column("attempts"),
        schema=schema,
    )
    counts = sa.table(
        "dex_call_counts",
        *(
            sa.column(name)
            for name in ("tool_name", "effect", "status", "shard", "calls", "attempts", "retries")
        ),
        schema=schema,
    )
    attempts = sa.func.coalesce(calls.c.attempts, 0)
    retries = sa.case((attempts > 1, attempts - 1), else_=0)
    ended = (
        sa.select(
            calls.c.tool_name,
            calls.c.effect,
            calls.c.status,
            sa.literal(0),
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(attempts), 0),
            sa.func.coalesce(sa.func.sum(retries), 0),
        )
        .where(calls.c.status.in_(_TERMINAL))
        .group_by(calls.c.tool_name, calls.c.effect, calls.c.status)
    )
    op.execute(
        counts.insert().from_select(
            ["tool_name", "effect", "status", "shard", "calls", "attempts", "retries"], ended
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.drop_column("trace_context")
    op.drop_table("dex_call_counts")
