"""Tools declared in a system message on upstream routes (fake upstreams over real sockets):
Moonshot's API gets them where they were declared; vLLM gets them there and in the request's
tools; every other engine gets them lifted into the request's tools, with a note in the system
text at that point. Either way the call comes back to the client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_upstream_dialects import ARGS, _usage
from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config, front

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
TIME: Any = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
MESSAGES: Any = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "system", "content": "", "tools": [WEATHER]},
    {"role": "user", "content": "Weather in Paris?"},
]


def _offered(body: dict[str, Any]) -> list[str]:
    names = [t["function"]["name"] for t in body.get("tools", ())]
    names += [t["function"]["name"] for m in body["messages"] for t in m.get("tools", ())]
    return names


async def caller(body: dict[str, Any], c: Conn) -> None:
    """Calls get_weather when it was offered anywhere: in the request's tools or a message's."""
    await c.head()
    await c.event(chunk({"role": "assistant", "content": ""}))
    if "get_weather" in _offered(body):
        await c.event(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ARGS},
                        }
                    ]
                }
            )
        )
        await c.event(chunk({}, "tool_calls"))
    else:
        await c.event(chunk({"content": "No tool."}, "stop"))
    await c.event({**chunk({}), "choices": [], "usage": _usage()})
    await c.done()


def _names(tools: list[dict[str, Any]] | None) -> list[str]:
    return [t["function"]["name"] for t in tools or ()]


# dialect -> (the request's tools, the declaring message's tools, whether its content is a note)
EXPECTED: dict[str, tuple[list[str], list[str], bool]] = {
    "moonshot": (["get_time"], ["get_weather"], False),
    "vllm": (["get_time", "get_weather"], ["get_weather"], False),
    "sglang": (["get_time", "get_weather"], [], True),
    "llamacpp": (["get_time", "get_weather"], [], True),
    "openai": (["get_time", "get_weather"], [], True),
}


@pytest.mark.parametrize("contract", ["evolink", "moonshot"])
@pytest.mark.parametrize("dialect", list(EXPECTED))
def test_declared_tools_reach_each_dialect(dialect: str, contract: str, tmp_path: Path) -> None:
    listed, native, noted = EXPECTED[dialect]
    with FakeUpstream(caller) as up, front(tmp_path, config(up.url, dialect=dialect), contract=contract) as f:
        resp = f.sdk.chat.completions.create(
            model="kimi-k3.1-pro", messages=MESSAGES, tools=[TIME], max_completion_tokens=50
        )
        sent = up.bodies[0]
        assert _names(sent.get("tools")) == listed
        declaring = sent["messages"][3]
        assert declaring["role"] == "system"
        assert _names(declaring.get("tools")) == native
        if noted:
            assert "get_weather" in declaring["content"] and "tools" not in declaring
        else:
            assert declaring["content"] == ""
        # The conversation around the declaration is untouched.
        assert [m["content"] for m in sent["messages"][:3]] == ["Be brief.", "Hi", "Hello!"]
        call: Any = resp.choices[0].message.tool_calls
        assert call and call[0].function.name == "get_weather"
        assert json.loads(call[0].function.arguments) == {"city": "Paris"}


def test_moonshot_gets_only_declared_tools_with_required(tmp_path: Path) -> None:
    with FakeUpstream(caller) as up, front(tmp_path, config(up.url, dialect="moonshot"), contract="moonshot") as f:
        resp = f.sdk.chat.completions.create(
            model="kimi-k3", messages=MESSAGES, tool_choice="required", max_completion_tokens=50, stream=True
        )
        deltas = [d for c in resp if c.choices for d in c.choices[0].delta.tool_calls or ()]
        names = [d.function.name for d in deltas if d.function and d.function.name]
        sent = up.bodies[0]
        assert "tools" not in sent and sent["tool_choice"] == "required"
        assert _names(sent["messages"][3]["tools"]) == ["get_weather"]
        assert names == ["get_weather"]


def test_responses_developer_item_is_lifted(tmp_path: Path) -> None:
    items: Any = [
        {
            "role": "developer",
            "content": "",
            "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}],
        },
        {"role": "user", "content": "Weather in Paris?"},
    ]
    with FakeUpstream(caller) as up, front(tmp_path, config(up.url, dialect="sglang")) as f:
        resp = f.sdk.responses.create(model="kimi-k3.1-pro", input=items, max_output_tokens=50)
        sent = up.bodies[0]
        assert _names(sent["tools"]) == ["get_weather"]
        assert sent["tools"][0]["function"].get("strict") is True  # Responses tools are strict by default
        assert "get_weather" in sent["messages"][0]["content"]
        assert [o.type for o in resp.output][-1] == "function_call"
