"""kimi-server in front of fake upstreams, in-process: the app through Starlette's TestClient,
the official openai SDK on top of it (``http_client``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from fastapi.testclient import TestClient

from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.engines.upstream.relay import Upstream
from kimi_server.settings import UpstreamConfig
from tests.conftest import TEST_KEY, build_app


@dataclass
class Front:
    sdk: openai.OpenAI
    http: TestClient
    engine: UpstreamEngine


def config(url: str, **fields: Any) -> UpstreamConfig:
    """Short timeouts and backoff: each fault under test resolves within a few seconds."""
    defaults: dict[str, Any] = {
        "connect_timeout": 2.0,
        "read_timeout": 2.0,
        "backoff": 0.01,
        "breaker_cooldown": 0.5,
    }
    return UpstreamConfig(base_url=url, **{**defaults, **fields})


@contextmanager
def front(tmp: Path, *configs: UpstreamConfig, **settings: Any) -> Iterator[Front]:
    engine = UpstreamEngine([Upstream(c) for c in configs])
    app = build_app(tmp / "data", engine, **settings)
    auth = {"Authorization": f"Bearer {TEST_KEY}"}
    with TestClient(app, headers=auth, raise_server_exceptions=False) as http:
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=TEST_KEY, http_client=http, max_retries=0)
        yield Front(sdk, http, engine)
