"""Ledger v2: the write fence (claims of writes in SQL) and the database's ledger binding.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.add_column(sa.Column("claim_fence", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("claimed_attempt", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("claimed_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("claimed_by", sa.String(length=200), nullable=True))
    op.create_table(
        "dex_ledger_binding",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ledger_id", sa.String(length=64), nullable=False),
        sa.Column("location", sa.String(length=600), nullable=False),
        sa.Column("bound_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dex_ledger_binding")),
    )


def downgrade() -> None:
    op.drop_table("dex_ledger_binding")
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.drop_column("claimed_by")
        batch.drop_column("claimed_at")
        batch.drop_column("claimed_attempt")
        batch.drop_column("claim_fence")
