"""The write freeze (docs/semantics.md, S13.2): `dex_write_freezes` and `dex_freeze_holds`.

`dex_write_freezes` is the durable record of every freeze an operator began and ended (who,
when, why, which tools, hold or reject); its rows not yet thawed are the freezes in force, which
the ledger's copy is re-asserted from after Redis lost data. `dex_freeze_holds` names the calls a
freeze held for approval, so a thaw releases them in request order. Expand only: two new tables.

Revision ID: 0015
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "dex_write_freezes",
        sa.Column("id", _id, primary_key=True, autoincrement=True),
        sa.Column("tool", sa.String(200), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("frozen_by", sa.String(200), nullable=False),
        sa.Column("frozen_at", sa.Float(), nullable=False),
        sa.Column("thawed_by", sa.String(200), nullable=True),
        sa.Column("thawed_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dex_write_freezes")),
    )
    op.create_index(
        "ix_dex_write_freezes_active",
        "dex_write_freezes",
        ["tool"],
        sqlite_where=sa.text("thawed_at IS NULL"),
        postgresql_where=sa.text("thawed_at IS NULL"),
    )
    op.create_table(
        "dex_freeze_holds",
        sa.Column("call_key", sa.String(620), nullable=False),
        sa.Column("freeze_id", sa.BigInteger(), nullable=False),
        sa.Column("held_at", sa.Float(), nullable=False),
        sa.Column("may_have_run", sa.Integer(), nullable=False),
        sa.Column("released_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("call_key", name=op.f("pk_dex_freeze_holds")),
    )
    op.create_index("ix_dex_freeze_holds_freeze", "dex_freeze_holds", ["freeze_id"])


def downgrade() -> None:
    op.drop_index("ix_dex_freeze_holds_freeze", table_name="dex_freeze_holds")
    op.drop_table("dex_freeze_holds")
    op.drop_index("ix_dex_write_freezes_active", table_name="dex_write_freezes")
    op.drop_table("dex_write_freezes")
