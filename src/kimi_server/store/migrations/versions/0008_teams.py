"""Teams (a budget, limits and models over several keys), tags on keys, key rotation with a
grace period, and each ledger row's team.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("budget_nanos", sa.BigInteger(), nullable=True),
        sa.Column("spent_nanos", sa.BigInteger(), nullable=False),
        sa.Column("budget_period", sa.String(8), nullable=True),
        sa.Column("soft_budget_nanos", sa.BigInteger(), nullable=True),
        sa.Column("models", sa.Text(), nullable=True),
        sa.Column("capture", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.add_column("api_keys", sa.Column("team_id", sa.String(32), nullable=True))
    op.add_column("api_keys", sa.Column("tags", sa.Text(), nullable=True))
    op.add_column("api_keys", sa.Column("previous_digest", sa.String(64), nullable=True))
    op.add_column("api_keys", sa.Column("previous_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_api_keys_team_id", "api_keys", ["team_id"])
    op.create_index("ix_api_keys_previous_digest", "api_keys", ["previous_digest"])
    # Rows written before this revision belong to no team.
    op.add_column("usage", sa.Column("team_id", sa.String(32), nullable=True))
    op.create_index("ix_usage_team_created", "usage", ["team_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_usage_team_created", table_name="usage")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("team_id")
    op.drop_index("ix_api_keys_previous_digest", table_name="api_keys")
    op.drop_index("ix_api_keys_team_id", table_name="api_keys")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("previous_expires_at")
        batch.drop_column("previous_digest")
        batch.drop_column("tags")
        batch.drop_column("team_id")
    op.drop_table("teams")
