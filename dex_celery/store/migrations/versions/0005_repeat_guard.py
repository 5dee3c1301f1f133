"""The repeat guard (docs/semantics.md, S5.4): `dex_repeat_guards` and three call columns.

`dex_repeat_guards` holds, per session and digest of tool + canonical arguments, the call that
last passed the guard; `dex_tool_calls` gets the call's digest, and for a call the guard held
back the earlier call it repeats and why it waits (with a partial index on the former).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dex_repeat_guards",
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(620), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "digest", name=op.f("pk_dex_repeat_guards")),
    )
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.add_column(sa.Column("repeat_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("repeat_of", sa.String(620), nullable=True))
        batch.add_column(sa.Column("repeat_reason", sa.Text(), nullable=True))
    op.create_index(
        "ix_dex_tool_calls_repeat_of",
        "dex_tool_calls",
        ["repeat_of"],
        sqlite_where=sa.text("repeat_of IS NOT NULL"),
        postgresql_where=sa.text("repeat_of IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_dex_tool_calls_repeat_of", table_name="dex_tool_calls")
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.drop_column("repeat_reason")
        batch.drop_column("repeat_of")
        batch.drop_column("repeat_digest")
    op.drop_table("dex_repeat_guards")
