"""kimi-server: a self-hosted server for the Kimi API."""

__version__ = "0.1.0"
