"""SearXNG's JSON API (``GET /search?q=...&format=json``) as a provider.

The instance must have the ``json`` format enabled in its ``settings.yml``. Every failure
(timeout, refused connection, non-200, a body that is not the expected JSON) becomes a
``SearchFailed`` with a message that names no internal detail.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from kimi_server.search.base import SearchFailed, SearchHit, SearchOutcome

MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class SearxngProvider:
    name = "searxng"

    def __init__(self, base_url: str, *, timeout_s: float, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    async def search(self, query: str, limit: int) -> SearchOutcome:
        params = {"q": query, "format": "json"}
        try:
            async with (
                httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client,
                client.stream("GET", f"{self.base_url}/search", params=params, headers=self._headers) as response,
            ):
                if response.status_code != 200:
                    raise SearchFailed(f"the search service answered HTTP {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE_BYTES:
                        raise SearchFailed("the search service sent too large an answer")
        except httpx.TimeoutException:
            raise SearchFailed("the search service did not answer in time") from None
        except httpx.HTTPError:
            raise SearchFailed("the search service could not be reached") from None
        return SearchOutcome(query, _hits(bytes(body), limit))


def _hits(body: bytes, limit: int) -> tuple[SearchHit, ...]:
    try:
        data: Any = json.loads(body)
    except ValueError:
        raise SearchFailed("the search service sent an answer that is not JSON") from None
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise SearchFailed("the search service sent an answer without results")
    hits: list[SearchHit] = []
    for r in results:
        if not isinstance(r, dict) or not isinstance(r.get("url"), str):
            continue
        url = r["url"]
        if not url.startswith(("http://", "https://")):
            continue
        title = str(r["title"]) if isinstance(r.get("title"), str) else url
        snippet = str(r["content"]) if isinstance(r.get("content"), str) else ""
        hits.append(SearchHit(" ".join(title.split()), url, " ".join(snippet.split())))
        if len(hits) >= limit:
            break
    return tuple(hits)
