"""Messages copied from an agent framework's history: `dex_messages.mirror_key`.

An agent framework (Pydantic AI, LangGraph, the OpenAI Agents SDK) keeps its own message history;
the user and assistant messages that led to a call are copied into the session with their
identity in that history, unique per session, so a history seen again is not copied twice
(docs/frameworks.md, "One conversation"). Expand only: a nullable column and an index, so
workers of the previous release keep working against this schema.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dex_messages", schema=table_schema()) as batch:
        batch.add_column(sa.Column("mirror_key", sa.String(64), nullable=True))
        batch.create_index("uq_dex_messages_mirror", ["session_id", "mirror_key"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("dex_messages", schema=table_schema()) as batch:
        batch.drop_index("uq_dex_messages_mirror")
        batch.drop_column("mirror_key")
