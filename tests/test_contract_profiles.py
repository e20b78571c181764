"""Contract profiles over HTTP, against the scripted engine: the evolink reference (the default)
and Moonshot's own rules (the thinking switch, kimi-k3's fixed sampling), per server and per
route, on both endpoints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.settings import ModelRoute, Settings
from tests.conftest import ScriptedApp

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
OFF = {"type": "disabled"}
ON = {"type": "enabled"}


@pytest.fixture
def moonshot(engine: ScriptedEngine, scripted_app: ScriptedApp) -> Iterator[TestClient]:
    with scripted_app(engine, contract="moonshot") as c:
        yield c


def chat(model: str = "kimi-k3", **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], **kw}


def responses(model: str = "kimi-k3", **kw: Any) -> dict[str, Any]:
    return {"model": model, "input": "Hi", **kw}


def refused(resp: Any, param: str) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert param in err["message"]


# --- which profile applies ---------------------------------------------------------------------


def test_models_report_the_profile(client: TestClient, engine: ScriptedEngine, scripted_app: ScriptedApp) -> None:
    listed = client.get("/v1/models").json()["data"]
    assert {m["id"]: m["contract"] for m in listed} == {s.id: "evolink" for s in CATALOGUE}
    routes = {"kimi-k3": ModelRoute(contract="moonshot")}
    with scripted_app(engine, routes=routes) as mixed:
        listed = mixed.get("/v1/models").json()["data"]
        assert {m["id"]: m["contract"] for m in listed} == {
            "kimi-k3.1-pro": "evolink",
            "kimi-k3.1-pro-highspeed": "evolink",
            "kimi-k3": "moonshot",
        }
        assert mixed.get("/v1/models/kimi-k3").json()["contract"] == "moonshot"
        # The route's profile, not the server's, decides: only kimi-k3 switches reasoning off.
        off = mixed.post(CHAT, json=chat(thinking=OFF)).json()["choices"][0]["message"]
        assert "reasoning_content" not in off
        kept = mixed.post(CHAT, json=chat("kimi-k3.1-pro", thinking=OFF)).json()["choices"][0]["message"]
        assert kept["reasoning_content"] == "Let me think."


def test_a_route_may_keep_the_reference_on_a_moonshot_server(engine: ScriptedEngine, scripted_app: ScriptedApp) -> None:
    routes = {"kimi-k3": ModelRoute(contract="evolink")}
    with scripted_app(engine, contract="moonshot", routes=routes) as c:
        assert c.get("/v1/models/kimi-k3").json()["contract"] == "evolink"
        assert c.get("/v1/models/kimi-k3.1-pro").json()["contract"] == "moonshot"
        assert c.post(CHAT, json=chat(presence_penalty=0.5)).status_code == 200


def test_unknown_contract_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="contract"):
        Settings.model_validate({"data_dir": tmp_path, "contract": "openai"})
    with pytest.raises(ValueError, match="contract"):
        ModelRoute.model_validate({"contract": "acme"})


# --- the thinking switch -----------------------------------------------------------------------


def test_thinking_disabled_turns_reasoning_off(moonshot: TestClient, engine: ScriptedEngine) -> None:
    data = moonshot.post(CHAT, json=chat(thinking=OFF)).json()
    message = data["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Hello there."}
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert engine.requests[-1].reasoning is False
    on = moonshot.post(CHAT, json=chat(thinking=ON)).json()
    assert on["choices"][0]["message"]["reasoning_content"] == "Let me think."
    assert on["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2


def test_thinking_disabled_stream_has_no_reasoning(moonshot: TestClient) -> None:
    text = moonshot.post(CHAT, json=chat(thinking=OFF, stream=True)).text
    deltas = [
        json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
        for line in text.splitlines()
        if line.startswith("data: {")
    ]
    assert not any("reasoning_content" in d for d in deltas)
    assert "".join(d.get("content", "") for d in deltas) == "Hello there."


def test_thinking_disabled_on_responses(moonshot: TestClient) -> None:
    r = moonshot.post(RESPONSES, json=responses(thinking=OFF)).json()
    assert [item["type"] for item in r["output"]] == ["message"]
    assert r["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    assert r["temperature"] == 0.6  # kimi-k3 runs non-thinking at 0.6
    r = moonshot.post(RESPONSES, json=responses(thinking=ON)).json()
    assert [item["type"] for item in r["output"]] == ["reasoning", "message"]
    assert r["temperature"] == 1.0
    text = moonshot.post(RESPONSES, json=responses(thinking=OFF, stream=True)).text
    events = [json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.completed"
    assert not [e for e in events if "reasoning" in e["type"]]
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"] == ["message"]


@pytest.mark.parametrize(
    ("thinking", "param"),
    [
        ("disabled", "thinking"),
        (True, "thinking"),
        ({"type": "off"}, "thinking.type"),
        ({"type": ""}, "thinking.type"),
        ({"keep": "last"}, "thinking.keep"),
        ({"type": "enabled", "keep": "last"}, "thinking.keep"),
    ],
)
@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_invalid_thinking_is_a_400(moonshot: TestClient, endpoint: str, thinking: Any, param: str) -> None:
    make = chat if endpoint == CHAT else responses
    refused(moonshot.post(endpoint, json=make("kimi-k3.1-pro", thinking=thinking)), param)


def test_thinking_keep_all_is_accepted(moonshot: TestClient) -> None:
    assert moonshot.post(CHAT, json=chat(thinking={"type": "enabled", "keep": "all"})).status_code == 200


@pytest.mark.parametrize("thinking", [{}, {"keep": "all"}, {"type": None}, {"type": None, "keep": None}])
@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_thinking_without_type_means_enabled(
    moonshot: TestClient, client: TestClient, engine: ScriptedEngine, endpoint: str, thinking: dict[str, Any]
) -> None:
    """Moonshot's clients send {"keep": "all"} or {} for thinking on: both profiles reason."""
    make = chat if endpoint == CHAT else responses
    for server in (moonshot, client):
        r = server.post(endpoint, json=make("kimi-k3.1-pro", thinking=thinking))
        assert r.status_code == 200, r.text
        assert engine.requests[-1].reasoning is True
    if endpoint == CHAT:
        message = moonshot.post(CHAT, json=chat(thinking=thinking)).json()["choices"][0]["message"]
        assert message["reasoning_content"] == "Let me think."


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_evolink_ignores_thinking(client: TestClient, engine: ScriptedEngine, endpoint: str) -> None:
    """The reference: reasoning is always on, and the field is one OpenAI clients may send."""
    make = chat if endpoint == CHAT else responses
    for value in (OFF, "nonsense", {"type": "off"}):
        assert client.post(endpoint, json=make(thinking=value)).status_code == 200
        assert engine.requests[-1].reasoning is True
    message = client.post(CHAT, json=chat(thinking=OFF)).json()["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me think."


# --- kimi-k3's fixed sampling under moonshot ---------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 0.5), ("frequency_penalty", 0.5), ("top_p", 0.8), ("temperature", 0.5)],
)
@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
@pytest.mark.parametrize("thinking", [ON, OFF])
def test_fixed_sampling_refused(
    moonshot: TestClient, endpoint: str, thinking: dict[str, str], field: str, value: float
) -> None:
    make = chat if endpoint == CHAT else responses
    sampling: dict[str, Any] = {field: value}
    refused(moonshot.post(endpoint, json=make(thinking=thinking, **sampling)), field)


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_temperature_follows_the_mode(moonshot: TestClient, endpoint: str) -> None:
    make = chat if endpoint == CHAT else responses
    refused(moonshot.post(endpoint, json=make(thinking=OFF, temperature=1.0)), "temperature")
    refused(moonshot.post(endpoint, json=make(thinking=ON, temperature=0.6)), "temperature")
    refused(moonshot.post(endpoint, json=make(temperature=0.6)), "temperature")  # thinking is the default
    refused(moonshot.post(endpoint, json=make(thinking=OFF, temperature=2.5)), "temperature")


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_default_values_accepted_in_both_modes(moonshot: TestClient, endpoint: str) -> None:
    make = chat if endpoint == CHAT else responses
    fixed: dict[str, Any] = {"top_p": 0.95, "presence_penalty": 0, "frequency_penalty": 0.0}
    extra: dict[str, Any] = {"n": 1} if endpoint == CHAT else {}
    for thinking, temperature in ((ON, 1.0), (OFF, 0.6), (None, 1)):
        sent = make(thinking=thinking, temperature=temperature, **fixed, **extra)
        assert moonshot.post(endpoint, json=sent).status_code == 200, (thinking, temperature)


def test_n_other_than_one_refused_in_both_profiles(moonshot: TestClient, client: TestClient) -> None:
    for c in (moonshot, client):
        refused(c.post(CHAT, json=chat(n=2)), "n")


def test_k31_keeps_its_rules_under_moonshot(moonshot: TestClient) -> None:
    """The fixed values are kimi-k3's; the K3.1 pair ignores sampling fields in both profiles."""
    sent = chat("kimi-k3.1-pro", thinking=OFF, temperature=0.3, top_p=0.5, presence_penalty=1.5)
    assert moonshot.post(CHAT, json=sent).status_code == 200


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_evolink_sampling_unchanged(client: TestClient, endpoint: str) -> None:
    make = chat if endpoint == CHAT else responses
    # Penalties are ignored; kimi-k3's temperature is fixed at 1 whatever the thinking field says.
    assert client.post(endpoint, json=make(presence_penalty=0.5, frequency_penalty=0.5)).status_code == 200
    refused(client.post(endpoint, json=make(thinking=OFF, temperature=0.6)), "temperature")
    refused(client.post(endpoint, json=make(top_p=0.8)), "top_p")


def test_serve_prints_the_contract(tmp_path: Path) -> None:
    from kimi_server.cli import start_lines

    settings = Settings(data_dir=tmp_path, contract="moonshot", routes={"kimi-k3": ModelRoute(contract="evolink")})
    assert "  contract: moonshot (kimi-k3: evolink)" in start_lines(settings, ["kimi-k3", "kimi-k3.1-pro"], None)
    assert "  contract: evolink" in start_lines(Settings(data_dir=tmp_path), ["kimi-k3"], None)
