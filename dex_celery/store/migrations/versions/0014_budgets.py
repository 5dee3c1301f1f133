"""Write budgets (S13.1): each call's charges, why a call waits for its budget, a verdict.

`dex_tool_calls.budgets` keeps the charges a call drew on as fixed at its request and
`budget_reason` why it waits for a person; `dex_budget_charges` lets a budget scope be counted
again from SQL after Redis lost it (docs/guardrails.md, "Budgets"); `dex_unknown_outcomes.verdict`
keeps what reconciliation said (went through, did not run). Expand only: nullable columns and a
new table, so the previous release runs on beside it.

Revision ID: 0014
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dex_celery.store.migrations.altering import table_schema

revision: str = "0014"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.add_column(sa.Column("budgets", sa.Text(), nullable=True))
        batch.add_column(sa.Column("budget_reason", sa.Text(), nullable=True))
    with op.batch_alter_table("dex_unknown_outcomes", schema=table_schema()) as batch:
        batch.add_column(sa.Column("verdict", sa.String(16), nullable=True))
    op.create_table(
        "dex_budget_charges",
        sa.Column("budget", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(220), nullable=False),
        sa.Column("call_key", sa.String(620), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("budget", "scope", "call_key", name="pk_dex_budget_charges"),
        schema=table_schema(),
    )


def downgrade() -> None:
    op.drop_table("dex_budget_charges", schema=table_schema())
    with op.batch_alter_table("dex_unknown_outcomes", schema=table_schema()) as batch:
        batch.drop_column("verdict")
    with op.batch_alter_table("dex_tool_calls", schema=table_schema()) as batch:
        batch.drop_column("budget_reason")
        batch.drop_column("budgets")
