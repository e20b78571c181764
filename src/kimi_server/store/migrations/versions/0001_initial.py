"""Keys and the usage ledger.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("rpm", sa.Integer),
        sa.Column("tpm", sa.Integer),
        sa.Column("budget_nanos", sa.BigInteger),
        sa.Column("spent_nanos", sa.BigInteger, nullable=False),
        sa.Column("models", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True)),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "usage",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("client_request_id", sa.String(128)),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("endpoint", sa.String(50), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("cache_write_tokens", sa.Integer, nullable=False),
        sa.Column("cache_ttl", sa.String(8), nullable=False),
        sa.Column("reasoning_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("web_search_calls", sa.Integer, nullable=False),
        sa.Column("cost_nanos", sa.BigInteger, nullable=False),
        sa.Column("ttft_ms", sa.Float),
        sa.Column("duration_ms", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_usage_key_id", "usage", ["key_id"])
    op.create_index("ix_usage_created_at", "usage", ["created_at"])


def downgrade() -> None:
    op.drop_table("usage")
    op.drop_table("api_keys")
