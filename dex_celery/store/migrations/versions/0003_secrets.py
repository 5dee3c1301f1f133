"""Sealed secret arguments: `dex_tool_calls.sealed_arguments` (docs/secrets.md).

`arguments` keeps the call's arguments with secret values replaced by `***`; the values live
only in this column, as one Fernet token opened by the worker with the `secret_key` setting.

Revision ID: 0003 (named i11_secrets before 0.1.0 shipped; `migrate.RENAMED` moves such databases on)
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.add_column(sa.Column("sealed_arguments", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.drop_column("sealed_arguments")
