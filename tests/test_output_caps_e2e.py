"""Default output caps through the real server and the real openai SDK: the operator's (global
and per model), a stored key's own (admin API and CLI), each applied only when a request names no
cap, and each reported by ``GET /v1/models``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from tests.conftest import LiveServer, start_server, stop_server

pytestmark = pytest.mark.e2e

ADMIN_KEY = "sk-admin-caps"
GLOBAL_CAP, K3_CAP = 6, 5  # both below the low effort's reasoning floor (8) in the test budgets
CONFIG = f'default_max_output_tokens = {GLOBAL_CAP}\n[routes."kimi-k3"]\ndefault_max_output_tokens = {K3_CAP}\n'


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    tmp = tmp_path_factory.mktemp("caps")
    config = tmp / "kimi.toml"
    config.write_text(CONFIG)
    proc, server = start_server(
        tmp,
        env={
            "KIMI_CONFIG": str(config),
            "KIMI_ADMIN_KEY": ADMIN_KEY,
            "KIMI_KEY_CACHE_SECONDS": "0",  # a changed key is seen by the next request
        },
    )
    try:
        yield server, tmp / "data"
    finally:
        stop_server(proc)


def reported(client: openai.OpenAI) -> dict[str, Any]:
    return {m.id: (m.model_extra or {}).get("default_max_output_tokens") for m in client.models.list()}


def ask(client: openai.OpenAI, model: str = "kimi-k3.1-pro", **extra: Any) -> Any:
    effort: dict[str, Any] = {"reasoning_effort": "low"} if model != "kimi-k3" else {}
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count from one to fifty in words."}],
        **effort,
        **extra,
    )


def test_operator_default_caps_apply_when_the_request_names_none(capped: tuple[LiveServer, Path]) -> None:
    server, _ = capped
    client = openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0)
    assert reported(client) == {"kimi-k3.1-pro": GLOBAL_CAP, "kimi-k3.1-pro-highspeed": GLOBAL_CAP, "kimi-k3": K3_CAP}
    plain = ask(client)
    # Cut by the cap, or an answer the model ended itself within it (the reasoning's attempt).
    assert plain.usage.completion_tokens <= GLOBAL_CAP
    if plain.choices[0].finish_reason == "stop":
        reasoning = (plain.choices[0].message.model_extra or {}).get("reasoning_content") or ""
        assert (plain.choices[0].message.content or "").strip() in reasoning
    else:
        assert plain.choices[0].finish_reason == "length"
    assert ask(client, "kimi-k3").usage.completion_tokens <= K3_CAP
    # The request's own cap wins: the low effort's reasoning floor (8) alone exceeds the default.
    own = ask(client, max_completion_tokens=12)
    assert GLOBAL_CAP < own.usage.completion_tokens <= 12
    response = client.responses.create(model="kimi-k3.1-pro", input="Count to fifty.", reasoning={"effort": "low"})
    assert response.max_output_tokens == GLOBAL_CAP
    assert response.usage is not None and response.usage.output_tokens <= GLOBAL_CAP


def test_a_keys_own_default_cap_from_the_admin_api_and_the_cli(
    capped: tuple[LiveServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, data_dir = capped
    admin = httpx.Client(
        base_url=server.base_url.removesuffix("/v1") + "/admin/v1", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    for bad in (0, -1, 2**31, "7", 1.5):
        r = admin.post("/keys", json={"name": "bad", "max_output_tokens": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens", (bad, r.text)
    made = admin.post("/keys", json={"name": "short", "max_output_tokens": 3})
    assert made.status_code == 200 and made.json()["max_output_tokens"] == 3
    client = openai.OpenAI(base_url=server.base_url, api_key=made.json()["secret"], max_retries=0)
    assert set(reported(client).values()) == {3}
    assert ask(client).usage.completion_tokens <= 3
    assert ask(client, max_completion_tokens=12).usage.completion_tokens > 3
    cleared = admin.patch("/keys/short", json={"clear": ["max_output_tokens"]})
    assert cleared.status_code == 200 and cleared.json()["max_output_tokens"] is None
    assert reported(client)["kimi-k3.1-pro"] == GLOBAL_CAP

    # The CLI writes the same column, in the server's own database.
    monkeypatch.setenv("KIMI_DATA_DIR", str(data_dir))
    runner = CliRunner()
    out = runner.invoke(cli_app, ["keys", "create", "--name", "cli-short", "--max-output-tokens", "2"])
    assert out.exit_code == 0, out.output
    secret = next(line for line in out.stdout.splitlines() if line.startswith("sk-kimi-"))
    cli_client = openai.OpenAI(base_url=server.base_url, api_key=secret, max_retries=0)
    assert set(reported(cli_client).values()) == {2}
    assert ask(cli_client).usage.completion_tokens <= 2
    assert runner.invoke(cli_app, ["keys", "create", "--name", "x", "--max-output-tokens", "0"]).exit_code != 0
    assert runner.invoke(cli_app, ["keys", "update", "cli-short", "--clear", "max_output_tokens"]).exit_code == 0
    assert set(reported(cli_client).values()) == {GLOBAL_CAP, K3_CAP}
