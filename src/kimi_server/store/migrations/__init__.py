"""Alembic migrations (``versions/``), run on every start by ``store.db.Database.migrate``."""
