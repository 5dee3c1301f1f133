"""MCP tool lists kept in the database: `dex_mcp_servers` and `dex_mcp_tool_pins`.

`dex_mcp_servers` holds each registered MCP server's tool list as last fetched (with its time
and the last fetch error), so no process but the one fetching it needs a server process;
`dex_mcp_tool_pins` the digest of each tool's accepted definition (a changed one waits for
approval until a person accepts it).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dex_mcp_servers",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("location", sa.String(600), nullable=False),
        sa.Column("tools", sa.Text(), nullable=True),
        sa.Column("fetched_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_error_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_dex_mcp_servers")),
    )
    op.create_table(
        "dex_mcp_tool_pins",
        sa.Column("server", sa.String(200), nullable=False),
        sa.Column("tool", sa.String(200), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("accepted_at", sa.Float(), nullable=False),
        sa.Column("accepted_by", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("server", "tool", name=op.f("pk_dex_mcp_tool_pins")),
    )


def downgrade() -> None:
    op.drop_table("dex_mcp_tool_pins")
    op.drop_table("dex_mcp_servers")
