"""``kimi-server chat``: an interactive terminal chat against a running server or any
OpenAI-compatible API (Moonshot's included)."""
