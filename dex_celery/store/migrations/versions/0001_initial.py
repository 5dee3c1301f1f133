"""The initial schema: sessions, messages, tool calls, surfaced unknown outcomes.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "dex_sessions",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("default_effect", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dex_sessions")),
    )
    op.create_table(
        "dex_messages",
        sa.Column("id", _id, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("tool_output", sa.Text(), nullable=True),
        sa.Column("turn_id", sa.String(length=200), nullable=True),
        sa.Column("tool_call_id", sa.String(length=200), nullable=True),
        sa.Column("tool_name", sa.String(length=200), nullable=True),
        sa.Column("tool_arguments", sa.Text(), nullable=True),
        sa.Column("call_key", sa.String(length=620), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dex_messages")),
        sa.UniqueConstraint("call_key", name=op.f("uq_dex_messages_call_key")),
    )
    op.create_index("ix_dex_messages_session", "dex_messages", ["session_id", "id"])
    op.create_table(
        "dex_tool_calls",
        sa.Column("key", sa.String(length=620), nullable=False),
        sa.Column("session_id", sa.String(length=200), nullable=False),
        sa.Column("turn_id", sa.String(length=200), nullable=False),
        sa.Column("tool_call_id", sa.String(length=200), nullable=False),
        sa.Column("tool_name", sa.String(length=200), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("effect", sa.String(length=32), nullable=False),
        sa.Column("requires_approval", sa.Integer(), nullable=False),
        sa.Column("policy", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("attempt_log", sa.Text(), nullable=True),
        sa.Column("late_result", sa.Text(), nullable=True),
        sa.Column("ledger_epoch", sa.String(length=64), nullable=True),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("approval_deadline", sa.Float(), nullable=True),
        sa.Column("decision", sa.String(length=16), nullable=True),
        sa.Column("decided_by", sa.String(length=200), nullable=True),
        sa.Column("decided_at", sa.Float(), nullable=True),
        sa.Column("decision_note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_dex_tool_calls")),
    )
    op.create_index("ix_dex_tool_calls_session", "dex_tool_calls", ["session_id", "requested_at"])
    op.create_index(
        "ix_dex_tool_calls_in_flight",
        "dex_tool_calls",
        ["requested_at", "key"],
        sqlite_where=sa.text("status = 'pending'"),
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_dex_tool_calls_awaiting",
        "dex_tool_calls",
        ["approval_deadline"],
        sqlite_where=sa.text("status = 'awaiting_approval'"),
        postgresql_where=sa.text("status = 'awaiting_approval'"),
    )
    op.create_table(
        "dex_unknown_outcomes",
        sa.Column("call_key", sa.String(length=620), nullable=False),
        sa.Column("session_id", sa.String(length=200), nullable=False),
        sa.Column("tool_name", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("surfaced_at", sa.Float(), nullable=False),
        sa.Column("checks", sa.Integer(), nullable=False),
        sa.Column("last_checked_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("report", sa.Text(), nullable=True),
        sa.Column("reported_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("call_key", name=op.f("pk_dex_unknown_outcomes")),
    )
    op.create_index("ix_dex_unknown_outcomes_open", "dex_unknown_outcomes", ["state", "tool_name"])


def downgrade() -> None:
    op.drop_index("ix_dex_unknown_outcomes_open", table_name="dex_unknown_outcomes")
    op.drop_table("dex_unknown_outcomes")
    op.drop_index("ix_dex_tool_calls_awaiting", table_name="dex_tool_calls")
    op.drop_index("ix_dex_tool_calls_in_flight", table_name="dex_tool_calls")
    op.drop_index("ix_dex_tool_calls_session", table_name="dex_tool_calls")
    op.drop_table("dex_tool_calls")
    op.drop_index("ix_dex_messages_session", table_name="dex_messages")
    op.drop_table("dex_messages")
    op.drop_table("dex_sessions")
