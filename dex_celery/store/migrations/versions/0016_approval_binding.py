"""Approvals bound to what was approved (docs/guardrails.md, S13.3): digests and edits.

A call that waits for a person keeps the digest of its validated arguments and of its tool's
definition (`tools/definition_digest.py`); an approval keeps the binding of the two it was given
for, and the worker's claim consumes it only while its own tool and arguments give the same
binding. An approver's edit of the arguments is kept (who, when, before, after, secrets `***`),
and a call that waits again says why. Expand only: nullable columns.

Revision ID: 0016
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0016"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("definition_digest", sa.String(64)),
    ("arguments_digest", sa.String(64)),
    ("approved_digest", sa.String(64)),
    ("approval_used_at", sa.Float()),
    ("approval_edit", sa.Text()),
    ("rewait_reason", sa.Text()),
)


def upgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        for name, kind in _COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
