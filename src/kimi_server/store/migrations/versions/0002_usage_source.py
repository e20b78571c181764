"""The ledger says who counted each row's tokens: the engine, or the server when the engine
reported none.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows written before this revision were all counted by their engine.
    op.add_column("usage", sa.Column("usage_source", sa.String(16), nullable=False, server_default="engine"))


def downgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("usage_source")
