"""The sign-in form's CSRF token, bound to a server secret.

Before anyone is signed in there is no session to hold a token, so the form carries one the
server signed: a random nonce, when it was issued, and an HMAC of both under a key derived from
``console_key_file``. The nonce also goes in a SameSite=Strict cookie, and a sign-in needs the
form's token valid, recent and naming that cookie's nonce. Whoever sets both the cookie and the
form field (a sibling site that can write cookies, a script) cannot make a token the server
accepts without the key. Every worker derives the same key, so a form from one is good at all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

LIFETIME = 3600  # seconds a sign-in form stays good
_SKEW = 60  # seconds a token may seem to come from the future (clocks of several machines)
_LABEL = b"kimi-console-login-csrf-v1"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class LoginTokens:
    def __init__(self, console_key: bytes) -> None:
        # A key of its own: the console's sealing key is never used for two jobs.
        self._key = hmac.new(console_key, _LABEL, hashlib.sha256).digest()

    def _mac(self, nonce: str, issued: int) -> str:
        return _b64(hmac.new(self._key, f"{nonce}.{issued}".encode(), hashlib.sha256).digest())

    def issue(self, now: float | None = None) -> tuple[str, str]:
        """A fresh (cookie value, form value) pair."""
        nonce = _b64(secrets.token_bytes(18))
        issued = int(time.time() if now is None else now)
        return nonce, f"{nonce}.{issued}.{self._mac(nonce, issued)}"

    def valid(self, cookie: str | None, form: str, now: float | None = None) -> bool:
        """Whether ``form`` is a token this server issued, within its lifetime, for the nonce
        in ``cookie``."""
        nonce, _, rest = form.partition(".")
        issued_text, _, mac = rest.partition(".")
        well_formed = issued_text.isascii() and issued_text.isdigit() and len(issued_text) <= 12
        if not cookie or not nonce or not mac or not well_formed:
            return False
        issued = int(issued_text)
        at = time.time() if now is None else now
        if not at - LIFETIME <= issued <= at + _SKEW:
            return False
        expected = self._mac(nonce, issued)
        return hmac.compare_digest(expected.encode(), mac.encode()) and hmac.compare_digest(
            nonce.encode(), cookie.encode()
        )
