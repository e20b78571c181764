"""`kimi-server upstreams check` against a fake upstream on a real socket: the model must be
listed, and each failure says what to do in words (never an exception's class name)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kimi_server.cli import app
from tests.conftest import _free_port
from tests.upstreams.fake import Conn, FakeUpstream

SERVED = ["Qwen/Qwen2.5-0.5B-Instruct", "llama-3.1-8b"]


def serving(*ids: str) -> Any:
    async def models(_: dict[str, Any], c: Conn) -> None:
        await c.json(200, {"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})

    return models


def status(code: int) -> Any:
    async def refuse(_: dict[str, Any], c: Conn) -> None:
        await c.json(code, {"error": {"message": "no", "type": "invalid_request_error"}})

    return refuse


async def unused(_: dict[str, Any], c: Conn) -> None:
    raise AssertionError("upstreams check only lists models")


def check(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["upstreams", "check", *args], env=env)
    assert "Error" not in result.output and "Exception" not in result.output, result.output
    return result.exit_code, " ".join(result.output.split())


def test_connection_refused_asks_whether_the_server_runs() -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    code, said = check("--upstream", url, "--upstream-model", "m")
    assert code == 1
    assert f"Connection refused): is the server running at {url}?" in said, said
    assert "ConnectError" not in said


def test_a_base_url_without_a_scheme_is_named_not_blamed_on_the_server() -> None:
    port = _free_port()
    code, said = check("--upstream", f"127.0.0.1:{port}", "--upstream-model", "m")
    assert code == 2, said
    assert f"--upstream = '127.0.0.1:{port}': " in said and "needs http:// or https://" in said, said
    assert f"e.g. http://127.0.0.1:{port}/v1" in said and "is the server running" not in said
    # The same check holds for a route's upstreams in the file, and for serve.
    from kimi_server.settings import UpstreamConfig

    with pytest.raises(ValueError, match="needs http:// or https://"):
        UpstreamConfig(base_url="localhost:8000/v1")
    assert UpstreamConfig(base_url="https://api.example.com/v1").base_url == "https://api.example.com/v1"


def test_a_model_the_upstream_does_not_serve_fails_naming_what_it_serves() -> None:
    with FakeUpstream(unused, routes={"/v1/models": serving(*SERVED)}) as up:
        code, said = check("--upstream", up.url, "--upstream-model", "kimi-k3")
        assert code == 1
        assert f"does not serve kimi-k3; it serves {', '.join(SERVED)}: set --upstream-model" in said, said
        code, said = check("--upstream", up.url)  # no model name: the public ids are sent as they are
        assert code == 1 and "set --upstream-model" in said and "kimi-k3.1-pro" in said, said
        code, said = check("--upstream", up.url, "--upstream-model", SERVED[0])
        assert code == 0 and said.startswith("ok") and f"serves {SERVED[0]}" in said, said
        # llama.cpp's server answers with its one model whatever the name: listed or not, it serves.
        code, said = check("--upstream", up.url, "--upstream-dialect", "llamacpp")
        assert code == 0 and "not listed" in said, said


def test_a_route_s_model_is_checked_and_the_advice_names_its_setting(tmp_path: Path) -> None:
    with FakeUpstream(unused, routes={"/v1/models": serving(*SERVED)}) as up:
        toml = tmp_path / "kimi.toml"
        toml.write_text(f"""
[routes."kimi-k3"]
engine = "upstream"
[[routes."kimi-k3".upstreams]]
base_url = "{up.url}"
model = "{SERVED[1]}"

[routes."kimi-k3.1-pro"]
engine = "upstream"
[[routes."kimi-k3.1-pro".upstreams]]
base_url = "{up.url}"
""")
        result = CliRunner().invoke(app, ["upstreams", "check", "--config", str(toml), "--json"])
    assert result.exit_code == 1, result.output
    good, bad = json.loads(result.output)
    assert (good["model"], good["ok"], good["served"]) == ("kimi-k3", True, SERVED)
    assert (bad["model"], bad["ok"], bad["problem"]) == ("kimi-k3.1-pro", False, "model_not_served")
    assert bad["advice"].endswith('set model = "..." in [[routes."kimi-k3.1-pro".upstreams]]'), bad


@pytest.mark.parametrize(
    ("env", "advice"),
    [
        ({}, "it wants an API key; name the environment variable holding it with api_key_env"),
        ({"KIMI_UPSTREAM_API_KEY_ENV": "OPS_UPSTREAM_KEY"}, "the environment variable $OPS_UPSTREAM_KEY is not set"),
        (
            {"KIMI_UPSTREAM_API_KEY_ENV": "OPS_UPSTREAM_KEY", "OPS_UPSTREAM_KEY": "sk-wrong"},
            "refused the key (HTTP 401): check the key in $OPS_UPSTREAM_KEY",
        ),
    ],
)
def test_a_refused_key_says_which_variable_to_check(
    env: dict[str, str], advice: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPS_UPSTREAM_KEY", raising=False)
    with FakeUpstream(unused, routes={"/v1/models": status(401)}) as up:
        code, said = check("--upstream", up.url, "--upstream-model", "m", env=env)
    assert code == 1 and advice in said, said


def test_a_base_url_without_v1_is_named() -> None:
    with FakeUpstream(unused, routes={"/models": status(404)}) as up:
        root = up.url.removesuffix("/v1")
        code, said = check("--upstream", root, "--upstream-model", "m")
    assert code == 1 and "answered 404: the base URL should end in /v1" in said, said


def test_the_check_says_how_each_dialect_keeps_forced_calls() -> None:
    with FakeUpstream(unused, routes={"/v1/models": serving("m")}) as up:
        code, said = check("--upstream", up.url, "--upstream-model", "m")
        assert code == 0 and "forced calls native (checked; a miss is asked again as JSON)" in said, said
        code, said = check("--upstream", up.url, "--upstream-model", "m", "--upstream-dialect", "llamacpp")
        assert code == 0 and "forced calls as JSON Schema answers" in said, said
        result = CliRunner().invoke(
            app, ["upstreams", "check", "--upstream", up.url, "--upstream-model", "m", "--json"]
        )
    [report] = json.loads(result.output)
    assert (report["forced_tool_calls"], report["transport"]) == ("native", "wire")
    assert "required_call" not in report  # no call unless asked for


def answering(with_call: bool) -> Any:
    async def answer(body: dict[str, Any], c: Conn) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": "4"}
        if with_call:
            fn = {"name": body["tools"][0]["function"]["name"], "arguments": '{"answer": "4"}'}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": fn}],
            }
        await c.json(200, {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    return answer


@pytest.mark.parametrize(("with_call", "outcome"), [(True, "honoured"), (False, "ignored")])
def test_probe_calls_asks_for_one_required_call(with_call: bool, outcome: str) -> None:
    with FakeUpstream(answering(with_call), routes={"/v1/models": serving("m")}) as up:
        code, said = check("--upstream", up.url, "--upstream-model", "m", "--probe-calls")
        result = CliRunner().invoke(
            app, ["upstreams", "check", "--upstream", up.url, "--upstream-model", "m", "--probe-calls", "--json"]
        )
    assert code == 0, said  # text is not a failure: kimi-server asks again
    [report] = json.loads(result.output)
    assert report["required_call"] == outcome
    probe = up.bodies[0]
    assert probe["tool_choice"] == "required" and probe["max_completion_tokens"] <= 96 and probe["stream"] is False
    if outcome == "ignored":
        assert "answered a required call with text: each forced call costs two" in said, said
        assert 'capabilities.forced_tool_calls = "json_schema"' in said, said
    else:
        assert "the upstream kept a required call itself" in said, said
