"""Budgets may start over each day, week or month; a soft budget tells the operator's webhook.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing keys keep a lifetime budget (NULL period) and no soft budget.
    op.add_column("api_keys", sa.Column("budget_period", sa.String(8), nullable=True))
    op.add_column("api_keys", sa.Column("soft_budget_nanos", sa.BigInteger(), nullable=True))
    # A period's spend is a range sum over one key's rows.
    op.create_index("ix_usage_key_created", "usage", ["key_id", "created_at"])
    op.create_table(
        "budget_alerts",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("period_start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("soft_budget_nanos", sa.BigInteger(), nullable=False),
        sa.Column("spent_nanos", sa.BigInteger(), nullable=False),
        sa.Column("crossed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(200), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("budget_alerts")
    op.drop_index("ix_usage_key_created", table_name="usage")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("soft_budget_nanos")
        batch.drop_column("budget_period")
