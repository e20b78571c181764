"""API keys as the server holds them: SHA-256 digests, and the short id derived from one. Its
own module, so the static key ring (``auth.py``) and the stored keys (``keys.py``) share it
without importing each other."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "sk-kimi-"  # the server's own keys; a stored key always has it


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_id_of(key: str) -> str:
    """The stable, non-secret id of a key (what ``Principal.key_id`` carries)."""
    return digest(key)[:16]


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)
