"""The one table of paths the middleware consults: which key a path needs, which paths admit
generations (and where their message list is), and the endpoint label of the metrics.

The routers declare their own paths; this table names the ones the code outside them must
recognise, so the guard, the request log and the limit headers never disagree about a path.
"""

from __future__ import annotations

from typing import Literal

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
# Anthropic's door as Kimi's platform serves it: ANTHROPIC_BASE_URL=http://host/anthropic
ANTHROPIC = "/anthropic"
ANTHROPIC_MESSAGES = ANTHROPIC + MESSAGES
ANTHROPIC_COUNT_TOKENS = ANTHROPIC + COUNT_TOKENS
ANTHROPIC_MODELS = ANTHROPIC + "/v1/models"
MODELS = "/v1/models"
HEALTH = "/health"
METRICS = "/metrics"
OPENAPI = "/openapi.json"
DOCS_PAGE = "/docs"
DOCS_ASSETS = "/docs/assets/"
ADMIN_PREFIX = "/admin/"
CONSOLE = "/console"
FILES = "/v1/files"
PLAYGROUND_FILES = CONSOLE + "/playground/files"  # the playground's documents, passed on to FILES
ESTIMATE_TOKENS = "/v1/tokenizers/estimate-token-count"
BALANCE = "/v1/users/me/balance"

# The generating routes, and the field holding each one's conversation (checked for length by
# the guard before the route parses it).
MESSAGE_LISTS = {
    CHAT: "messages",
    RESPONSES: "input",
    MESSAGES: "messages",
    ANTHROPIC_MESSAGES: "messages",
    COUNT_TOKENS: "messages",
    ANTHROPIC_COUNT_TOKENS: "messages",
    ESTIMATE_TOKENS: "messages",
}
ADMITTING = frozenset({CHAT, RESPONSES, MESSAGES, ANTHROPIC_MESSAGES})
MESSAGES_PATHS = frozenset({MESSAGES, ANTHROPIC_MESSAGES})
# Multipart uploads: streamed to the route (which spools them to disk), not read whole by the
# guard, and bounded by the upload limit (files_max_bytes) rather than max_body_bytes. The
# playground's attachment is one too: the file it passes on may be as large as the API takes.
UPLOADS = frozenset({FILES, PLAYGROUND_FILES})
COUNT_TOKENS_PATHS = frozenset({COUNT_TOKENS, ANTHROPIC_COUNT_TOKENS})

# Known endpoints keep the metric labels few; anything else is "other".
_LABELS = {
    CHAT: "chat.completions",
    RESPONSES: "responses",
    MESSAGES: "messages",
    ANTHROPIC_MESSAGES: "messages",
    COUNT_TOKENS: "messages.count_tokens",
    ANTHROPIC_COUNT_TOKENS: "messages.count_tokens",
    ESTIMATE_TOKENS: "tokenizers.estimate",
    BALANCE: "balance",
    MODELS: "models",
    ANTHROPIC_MODELS: "models",
    METRICS: "metrics",
    HEALTH: "health",
}

KeyNeeded = Literal["admin", "tenant"] | None


def key_needed(path: str) -> KeyNeeded:
    """The key a path needs: the admin key, an API key, or none (the route decides itself)."""
    if path.startswith(ADMIN_PREFIX):
        return "admin"
    if path in (HEALTH, OPENAPI):  # the document takes an API key or the admin key: its route checks
        return None
    if path == DOCS_PAGE or path.startswith(DOCS_ASSETS):  # static; the page asks for the key
        return None
    if path == METRICS:  # every key's traffic: the admin key, checked by the route itself
        return None
    if path == "/" or path == CONSOLE or path.startswith(CONSOLE + "/"):
        return None  # the console signs people in itself (console/session.py); / points there
    return "tenant"


def speaks_anthropic(path: str) -> bool:
    """Whether the path is on Anthropic's door, whose errors take Anthropic's shape."""
    return path.startswith(MESSAGES) or path.startswith(ANTHROPIC + "/")


def endpoint_label(path: str) -> str:
    if path in _LABELS:
        return _LABELS[path]
    if path.startswith(MODELS + "/"):
        return "models"
    if path.startswith(ADMIN_PREFIX):
        return "admin"
    if path == FILES or path.startswith(FILES + "/"):
        return "files"
    return "other"
