"""The audit log: `dex_audit_log`, `dex_audit_heads`, `dex_audit_checkpoints` (docs/audit.md).

Expand only: three new tables, so workers of the previous release keep working (they append no
entries; `audit verify` covers the calls requested after the log began).

Revision ID: 0017
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "dex_audit_log",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("writer", sa.String(40), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("call_key", sa.String(620), nullable=True),
        sa.Column("session_id", sa.String(200), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("prev", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("signature", sa.String(100), nullable=True),
        sa.Column("key_id", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dex_audit_log")),
    )
    op.create_index("uq_dex_audit_log_chain", "dex_audit_log", ["writer", "seq"], unique=True)
    op.create_index("ix_dex_audit_log_call", "dex_audit_log", ["call_key"])
    op.create_index("ix_dex_audit_log_at", "dex_audit_log", ["at"])
    op.create_table(
        "dex_audit_heads",
        sa.Column("writer", sa.String(40), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("signature", sa.String(100), nullable=True),
        sa.Column("key_id", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("writer", name=op.f("pk_dex_audit_heads")),
    )
    op.create_table(
        "dex_audit_checkpoints",
        sa.Column("writer", sa.String(40), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("cut_at", sa.Float(), nullable=False),
        sa.Column("signature", sa.String(100), nullable=True),
        sa.Column("key_id", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("writer", name=op.f("pk_dex_audit_checkpoints")),
    )


def downgrade() -> None:
    op.drop_table("dex_audit_checkpoints")
    op.drop_table("dex_audit_heads")
    op.drop_index("ix_dex_audit_log_at", table_name="dex_audit_log")
    op.drop_index("ix_dex_audit_log_call", table_name="dex_audit_log")
    op.drop_index("uq_dex_audit_log_chain", table_name="dex_audit_log")
    op.drop_table("dex_audit_log")
