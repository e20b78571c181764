"""Seals reasoning into the Responses ``encrypted_content`` (and the Messages thinking
``signature``, and a Messages web search result's text) and opens it again.

The server keeps no state, so the reasoning of one response travels to the client and back.
AES-256-GCM authenticates it: a blob that was altered, or sealed by another server or for another
API key, does not open. The key lives in a file (owner-only), made on first start.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kimi_server.errors import InvalidRequestError
from kimi_server.gate.keyfiles import ensure_private

VERSION = b"\x01"
NONCE_BYTES = 12
KEY_BYTES = 32


class Sealer:
    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"the Responses key must be {KEY_BYTES} bytes")
        self._aead = AESGCM(key)

    @staticmethod
    def _context(key_id: str, purpose: str) -> bytes:
        # Binding the API key's id means one tenant cannot replay another tenant's reasoning;
        # binding the purpose, that a blob sealed for one field does not open in another.
        return f"kimi-server/{purpose}/v1/".encode() + key_id.encode()

    def seal(self, reasoning: str, *, key_id: str, purpose: str = "reasoning") -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        plain = json.dumps({"reasoning": reasoning}, ensure_ascii=False).encode()
        sealed = self._aead.encrypt(nonce, plain, self._context(key_id, purpose))
        return base64.urlsafe_b64encode(VERSION + nonce + sealed).decode("ascii")

    def open(self, blob: str, *, key_id: str, param: str, purpose: str = "reasoning") -> str:
        """The reasoning inside ``blob``; a 400 naming ``param`` if it is not ours, intact."""
        refused = InvalidRequestError(
            f"'{param}' could not be verified: it was altered, or it was not issued by this "
            "server for this API key. Send the reasoning item exactly as a response returned it, "
            "or leave it out.",
            param=param,
            code="invalid_encrypted_content",
        )
        try:
            raw = base64.urlsafe_b64decode(blob.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise refused from None
        if len(raw) <= 1 + NONCE_BYTES or raw[:1] != VERSION:
            raise refused
        nonce, sealed = raw[1 : 1 + NONCE_BYTES], raw[1 + NONCE_BYTES :]
        try:
            plain = self._aead.decrypt(nonce, sealed, self._context(key_id, purpose))
        except InvalidTag:
            raise refused from None
        value = json.loads(plain)["reasoning"]
        return str(value)


def load_or_create_key(path: Path) -> bytes:
    """Reads the key file, or makes one (mode 0600) when it does not exist yet."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner-only when we make it
        # Written aside, then linked into place: a concurrent reader never sees a half key.
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode() + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first; use theirs
        finally:
            tmp.unlink()
    ensure_private(path)  # a key others can read is fixed or refused
    text = path.read_text(encoding="ascii").strip()
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{path} does not hold a base64 key") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"{path} must hold {KEY_BYTES} base64-encoded bytes")
    return key
