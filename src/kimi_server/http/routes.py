"""The one table of paths the middleware consults: which key a path needs, which paths admit
generations (and where their message list is), and the endpoint label of the metrics.

The routers declare their own paths; this table names the ones the code outside them must
recognise, so the guard, the request log and the limit headers never disagree about a path.
"""

from __future__ import annotations

from typing import Literal

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MODELS = "/v1/models"
HEALTH = "/health"
METRICS = "/metrics"
OPENAPI = "/openapi.json"
DOCS_PAGE = "/docs"
DOCS_ASSETS = "/docs/assets/"
ADMIN_PREFIX = "/admin/"
CONSOLE = "/console"

# The generating routes, and the field holding each one's conversation (checked for length by
# the guard before the route parses it).
MESSAGE_LISTS = {CHAT: "messages", RESPONSES: "input"}
ADMITTING = frozenset(MESSAGE_LISTS)

# Known endpoints keep the metric labels few; anything else is "other".
_LABELS = {CHAT: "chat.completions", RESPONSES: "responses", MODELS: "models", METRICS: "metrics", HEALTH: "health"}

KeyNeeded = Literal["admin", "tenant"] | None


def key_needed(path: str, *, public_docs: bool) -> KeyNeeded:
    """The key a path needs: the admin key, an API key, or none (the route decides itself)."""
    if path.startswith(ADMIN_PREFIX):
        return "admin"
    if path == HEALTH or (public_docs and path == OPENAPI):
        return None
    if path == DOCS_PAGE or path.startswith(DOCS_ASSETS):  # static; the page asks for the key
        return None
    if path == METRICS:  # every key's traffic: the admin key, checked by the route itself
        return None
    if path == "/" or path == CONSOLE or path.startswith(CONSOLE + "/"):
        return None  # the console signs people in itself (console/session.py); / points there
    return "tenant"


def endpoint_label(path: str) -> str:
    if path in _LABELS:
        return _LABELS[path]
    if path.startswith(MODELS + "/"):
        return "models"
    if path.startswith(ADMIN_PREFIX):
        return "admin"
    return "other"
