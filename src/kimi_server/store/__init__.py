"""Persistent storage for the gateway: API keys and the usage ledger (SQLAlchemy 2, async)."""
