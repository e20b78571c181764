"""Claims the docs make that are cheap to check: every setting they list exists, every flag they
name is a ``serve`` option, and the refusals they describe give the advice they describe."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from kimi_server.settings import Settings
from tests.conftest import ScriptedApp

DOCS = Path(__file__).resolve().parents[1] / "docs"
URL = "/v1/chat/completions"


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| `")]


def test_every_documented_setting_and_flag_exists() -> None:
    rows = table_rows((DOCS / "configuration.md").read_text().split("## Reasoning budgets")[0])
    assert len(rows) > 15
    help_text = CliRunner().invoke(cli_app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    for row in rows:
        for name in re.findall(r"`(\w+)`", row[0]):
            assert name in Settings.model_fields, f"docs/configuration.md lists {name!r}"
        for flag in re.findall(r"--[\w-]+", row[1]):
            assert flag in help_text, f"docs/configuration.md names {flag}"


def test_web_search_refusal_names_a_setting_that_exists(scripted_app: ScriptedApp) -> None:
    """With no search provider the refusal tells the operator which setting turns it on."""
    with scripted_app(web_search_provider="none") as c:
        for tools in ([{"type": "web_search"}], [{"type": "builtin_function", "function": {"name": "$web_search"}}]):
            r = c.post(
                URL, json={"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "x"}], "tools": tools}
            )
            error = r.json()["error"]
            assert r.status_code == 400 and error["code"] == "unsupported_tool" and error["param"] == "tools[0]"
            named = re.findall(r"\((\w+)\)", error["message"])
            assert named and all(n in Settings.model_fields for n in named)
        r = c.post("/v1/responses", json={"model": "kimi-k3.1-pro", "input": "x", "tools": [{"type": "web_search"}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_tool"


def test_vision_refusal_advises_what_a_client_can_do(client: TestClient) -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    r = client.post(URL, json={"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": [part]}]})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "unsupported_content"
    # No setting routes a model to a vision engine, so the advice is only to send text.
    assert "Send text only" in error["message"] and "route" not in error["message"]
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    r = client.post("/v1/responses", json={"model": "kimi-k3.1-pro", "input": [{"role": "user", "content": [image]}]})
    assert r.status_code == 400 and "route" not in r.json()["error"]["message"]


def test_wrong_method_is_405_in_the_error_shape(client: TestClient) -> None:
    r = client.get(URL)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
