"""The preview of a call waiting for approval: `dex_tool_calls.preview`.

A tool may declare a preview function; a worker runs it as a read when the call starts waiting
for a person and writes its text (or "preview unavailable: ...") here, for the approval page,
`approvals list`, the webhook and the frameworks' approval requests (docs/guardrails.md,
"Previews"). Expand only: one nullable column; rows of the previous release have no preview.

Revision ID: 0018
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0018"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.add_column(sa.Column("preview", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.drop_column("preview")
