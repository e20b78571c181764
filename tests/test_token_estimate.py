"""``POST /v1/tokenizers/estimate-token-count`` at the door: Moonshot's shape, the same checks as a
Chat Completions body (400s naming the field, 404 for a model not served), free of charge but
one request against the key's per-minute limit.

Real SQLite, real HTTP (uvicorn on a socket), the scripted engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.gateway_util import ADMIN_KEY, STATIC_KEY, make_app, serve

ESTIMATE = "/v1/tokenizers/estimate-token-count"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
BODY: dict[str, Any] = {"model": "kimi-k3", "messages": [{"role": "user", "content": "Hello there"}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_estimate_is_moonshots_shape_and_grows_with_the_prompt(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url, headers=bearer(STATIC_KEY)) as c:
        r = c.post(ESTIMATE, json=BODY)
        assert r.status_code == 200, r.text
        short = r.json()["data"]["total_tokens"]
        assert isinstance(short, int) and short > 0
        longer = {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": "Hi! " * 40}]}
        assert c.post(ESTIMATE, json=longer).json()["data"]["total_tokens"] > short


def test_bad_bodies_are_refused_naming_the_field(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url, headers=bearer(STATIC_KEY)) as c:
        cases: list[tuple[dict[str, Any], int, str]] = [
            ({"model": "kimi-k3"}, 400, "messages"),
            ({**BODY, "messages": []}, 400, "messages"),
            ({**BODY, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
            ({**BODY, "model": "no-such-model"}, 404, "model"),
            (
                {**BODY, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
                400,
                "tools[0].function.name",
            ),
        ]
        for body, status, param in cases:
            r = c.post(ESTIMATE, json=body)
            assert r.status_code == status, (body, r.text)
            error = r.json()["error"]
            assert error["param"] == param and error["message"], (body, error)
        assert c.post(ESTIMATE, json=BODY, headers=bearer("sk-wrong")).status_code == 401


def test_estimates_are_free_but_count_against_the_keys_rpm(tmp_path: Path) -> None:
    app, engine = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        r = c.post("/admin/v1/keys", json={"name": "counted", "rpm": 2}, headers=ADMIN)
        assert r.status_code == 200, r.text
        key = bearer(r.json()["secret"])
        assert [c.post(ESTIMATE, json=BODY, headers=key).status_code for _ in range(2)] == [200, 200]
        refused = c.post(ESTIMATE, json=BODY, headers=key)
        assert refused.status_code == 429 and refused.headers.get("retry-after")
        assert engine.requests == []  # nothing was generated
        assert c.get("/admin/v1/usage?by=key", headers=ADMIN).json()["data"] == []  # nor billed


def test_the_openapi_document_has_the_estimate_and_the_balance(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url, headers=bearer(STATIC_KEY)) as c:
        paths = c.get("/openapi.json").json()["paths"]
        assert "post" in paths[ESTIMATE] and "get" in paths["/v1/users/me/balance"]
        schema = paths[ESTIMATE]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/TokenEstimateResponse")
