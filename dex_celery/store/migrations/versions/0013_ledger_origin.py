"""What kind of Redis held the ledger a database is bound to: `dex_ledger_binding.origin`.

`dex-celery dev` and `demo` start a private redis-server that is gone once they stop; a
database bound to such a ledger may be bound again by the next such stack, while one bound to a
configured Redis keeps refusing until an operator runs `dex-celery db rebind-ledger`
(docs/ledger.md, "One database, one ledger"). Expand only: a column with a server default (rows
of the previous release read as `configured`, the careful kind) and a nullable column.

Revision ID: 0013
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0013"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dex_ledger_binding", schema=table_schema()) as batch:
        batch.add_column(
            sa.Column("origin", sa.String(16), nullable=False, server_default="configured")
        )
        batch.add_column(sa.Column("origin_host", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dex_ledger_binding", schema=table_schema()) as batch:
        batch.drop_column("origin_host")
        batch.drop_column("origin")
