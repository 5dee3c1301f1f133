"""Session owners: `dex_session_owners` (docs/security.md, "A call key is not a capability").

One row per session begun through `dex-celery mcp`, naming the identity that began it; that
server lets a caller request or follow calls only of sessions its identity owns.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dex_session_owners",
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_dex_session_owners")),
    )


def downgrade() -> None:
    op.drop_table("dex_session_owners")
