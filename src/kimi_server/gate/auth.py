"""API-key authentication. Keys are held only as SHA-256 digests, compared in constant time."""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kimi_server.errors import AuthenticationError
from kimi_server.gate.key_hash import KEY_PREFIX, digest, key_id_of, new_key
from kimi_server.gate.keyfiles import ensure_private

if TYPE_CHECKING:
    from kimi_server.gate.keys import KeyRecord

__all__ = ["KEY_PREFIX", "KeyRing", "Principal", "development_key", "digest", "key_id_of", "new_key"]


@dataclass(frozen=True)
class Principal:
    """Who made a request: a stable, non-secret id derived from the key."""

    key_id: str
    record: KeyRecord | None = None  # a stored key's limits; None for static keys

    @property
    def output_cap(self) -> int | None:
        """The key's own default output cap, if it has one."""
        return self.record.max_output_tokens if self.record is not None else None


class KeyRing:
    def __init__(self, keys: list[str]) -> None:
        self._digests = tuple(digest(k) for k in keys)

    def __len__(self) -> int:
        return len(self._digests)

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise AuthenticationError(
                "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                code="missing_api_key",
            )
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError(
                "Malformed Authorization header; expected 'Bearer YOUR_KEY'.",
                code="invalid_api_key",
            )
        presented = digest(token)
        # Compare against every key so the time taken says nothing about which one matched.
        matched = None
        for known in self._digests:
            if hmac.compare_digest(presented, known):
                matched = known
        if matched is None:
            raise AuthenticationError("Incorrect API key provided.", code="invalid_api_key")
        return Principal(key_id=matched[:16])  # == key_id_of(token)


def development_key(data_dir: Path) -> str:
    """A key for local use, made on first start and kept (owner-only) so it survives restarts."""
    path = data_dir / "dev-api-key"
    if path.is_file():
        ensure_private(path)  # a key others can read is fixed or refused
        key = path.read_text(encoding="utf-8").strip()
        if key:
            return key
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner-only when we make it
    key = new_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    return key
