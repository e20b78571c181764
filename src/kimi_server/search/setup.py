"""Builds the configured search provider (or none) from settings."""

from __future__ import annotations

from pathlib import Path

from kimi_server.search.base import SearchProvider
from kimi_server.search.local_index import LocalIndex
from kimi_server.search.searcher import Searcher
from kimi_server.search.searxng import SearxngProvider
from kimi_server.settings import Settings


def index_path(settings: Settings) -> Path:
    return settings.web_search_index or settings.data_dir / "search-index.sqlite3"


def build_searcher(settings: Settings) -> Searcher | None:
    provider: SearchProvider
    if settings.web_search_provider == "none":
        return None
    if settings.web_search_provider == "searxng":
        if not settings.web_search_url:
            raise ValueError("web_search_provider 'searxng' needs web_search_url")
        provider = SearxngProvider(
            settings.web_search_url,
            timeout_s=settings.web_search_timeout_s,
            api_key=settings.web_search_api_key,
        )
    else:
        provider = LocalIndex(index_path(settings))
    return Searcher(
        provider,
        max_results=settings.web_search_max_results,
        token_budget=settings.web_search_token_budget,
    )
