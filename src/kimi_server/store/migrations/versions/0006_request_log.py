"""The request log: how each request ended (finish reason, error code), and the prompts and
answers of keys that capture them.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows written before this revision say nothing of how they ended (NULL).
    op.add_column("usage", sa.Column("finish_reason", sa.String(16), nullable=True))
    op.add_column("usage", sa.Column("error_code", sa.String(64), nullable=True))
    op.add_column("api_keys", sa.Column("capture", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "captures",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("reasoning", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("tool_calls", sa.Text(), nullable=False),
    )
    op.create_index("ix_captures_created_at", "captures", ["created_at"])


def downgrade() -> None:
    op.drop_table("captures")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("capture")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("error_code")
        batch.drop_column("finish_reason")
