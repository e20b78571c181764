"""The generating routes are served by ``http/direct.py`` rather than FastAPI's dispatch, and
answer exactly as FastAPI's dispatch of the same endpoint functions would: every kind of bad
body gets the same status and the same error, and good bodies the same kind of answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.http import direct
from kimi_server.http.direct import DirectRoutes
from tests.conftest import TEST_KEY, build_app

CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "Hi"}]}
RESPONSES = {"model": "kimi-k3", "input": "Hi"}
JSON = "application/json"

# (path, body bytes, content type) for every way a body can be wrong, and some right ones.
CASES: list[tuple[str, bytes, str | None]] = [
    ("/v1/chat/completions", json.dumps(CHAT).encode(), JSON),
    ("/v1/chat/completions", json.dumps(CHAT).encode(), "application/json; charset=utf-8"),
    ("/v1/chat/completions", json.dumps(CHAT).encode(), "application/vnd.kimi+json"),
    ("/v1/chat/completions", json.dumps({**CHAT, "stream": True}).encode(), JSON),
    ("/v1/chat/completions", json.dumps(CHAT).encode(), "text/plain"),
    ("/v1/chat/completions", json.dumps(CHAT).encode(), None),
    ("/v1/chat/completions", b"", JSON),
    ("/v1/chat/completions", b"{not json", JSON),
    ("/v1/chat/completions", b"[1, 2]", JSON),
    ("/v1/chat/completions", b'"text"', JSON),
    ("/v1/chat/completions", b"null", JSON),
    ("/v1/chat/completions", b'{"model": "kimi-k3", "messages": "\xff\xfe"}', JSON),
    ("/v1/chat/completions", json.dumps({"messages": CHAT["messages"]}).encode(), JSON),
    ("/v1/chat/completions", json.dumps({"model": "kimi-k3"}).encode(), JSON),
    ("/v1/chat/completions", json.dumps({**CHAT, "messages": "Hi"}).encode(), JSON),
    ("/v1/chat/completions", json.dumps({**CHAT, "messages": [{"role": "robot", "content": "x"}]}).encode(), JSON),
    ("/v1/chat/completions", json.dumps({**CHAT, "temperature": "hot"}).encode(), JSON),
    ("/v1/chat/completions", json.dumps({**CHAT, "tools": [{"type": "function"}]}).encode(), JSON),
    ("/v1/chat/completions", json.dumps({**CHAT, "model": "no-such-model"}).encode(), JSON),
    ("/v1/chat/completions", json.dumps({**CHAT, "max_tokens": -1}).encode(), JSON),
    ("/v1/responses", json.dumps(RESPONSES).encode(), JSON),
    ("/v1/responses", json.dumps({**RESPONSES, "stream": True}).encode(), JSON),
    ("/v1/responses", b"", JSON),
    ("/v1/responses", b"{", JSON),
    ("/v1/responses", json.dumps({"model": "kimi-k3"}).encode(), JSON),
    ("/v1/responses", json.dumps({**RESPONSES, "input": 7}).encode(), JSON),
    ("/v1/responses", json.dumps({**RESPONSES, "input": [{"type": "message", "role": "x"}]}).encode(), JSON),
    ("/v1/responses", json.dumps({**RESPONSES, "previous_response_id": "resp_1"}).encode(), JSON),
]


def _client(tmp_path: Path, *, direct_routes: bool) -> TestClient:
    app = build_app(tmp_path / ("direct" if direct_routes else "fastapi"), ScriptedEngine(), keys=[TEST_KEY])
    if not direct_routes:
        for middleware in app.user_middleware:
            cls: object = middleware.cls
            if cls is DirectRoutes:
                middleware.kwargs["routes"] = {}  # every path falls through to FastAPI
    return TestClient(app, headers={"Authorization": f"Bearer {TEST_KEY}"}, raise_server_exceptions=False)


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[tuple[TestClient, TestClient]]:
    with _client(tmp_path, direct_routes=True) as fast, _client(tmp_path, direct_routes=False) as slow:
        yield fast, slow


def _answer(client: TestClient, path: str, body: bytes, ctype: str | None) -> tuple[int, Any]:
    headers = {"content-type": ctype} if ctype else {}
    r = client.post(path, content=body, headers=headers)
    if r.status_code != 200:
        return r.status_code, r.json()
    if r.headers["content-type"].startswith("text/event-stream"):
        # The same events in the same order; ids and times differ from run to run.
        return 200, [line.split(":")[0] for line in r.text.splitlines() if line]
    return 200, sorted(r.json())


@pytest.mark.parametrize(("path", "body", "ctype"), CASES)
def test_both_dispatches_answer_alike(
    clients: tuple[TestClient, TestClient], path: str, body: bytes, ctype: str | None
) -> None:
    fast, slow = clients
    assert _answer(fast, path, body, ctype) == _answer(slow, path, body, ctype)


def test_the_generating_routes_take_the_direct_path(
    clients: tuple[TestClient, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = getattr(direct, "authenticated")  # noqa: B009 (the name the module looks up)

    async def counting(request: Any) -> Any:
        seen.append(request.url.path)
        return await real(request)

    monkeypatch.setattr(direct, "authenticated", counting)
    fast, slow = clients
    assert fast.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert fast.post("/v1/responses", json=RESPONSES).status_code == 200
    assert fast.get("/v1/models").status_code == 200  # every other route is FastAPI's
    assert seen == ["/v1/chat/completions", "/v1/responses"]
    assert slow.post("/v1/chat/completions", json=CHAT).status_code == 200  # the comparison's other side
    assert seen == ["/v1/chat/completions", "/v1/responses"]


def test_openapi_still_documents_the_generating_routes(tmp_path: Path) -> None:
    with _client(tmp_path, direct_routes=True) as client:
        paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/chat/completions" in paths and "/v1/responses" in paths
    schema = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/ChatCompletionRequest"}
