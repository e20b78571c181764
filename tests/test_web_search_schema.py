"""Web search through both endpoints with the scripted engine and a real local index: the
$web_search loop in Chat Completions, web_search_call items and events in Responses (validated
against OpenAI's document, and the rest of each object against Open Responses, which defines no
web-search item), the 400s, and failed searches that stay readable results.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.llamacpp.gguf_meta import read_gguf_info
from kimi_server.engines.llamacpp.template import ChatTemplate
from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import GenerationRequest, ToolCallDelta
from kimi_server.search.local_index import LocalIndex
from tests.conftest import DEFAULT_MODEL, ScriptedApp, model_path
from tests.responses_util import parse_sse, weather_tool
from tests.test_responses_schema import OPEN, OPENAI, check, event_schemas

SEARCH_ARGS = '{"query": "zorblax lighthouse colour"}'
SEARCH = ToolCallDelta(0, "call_ws1", "$web_search", SEARCH_ARGS, "builtin_function")


# --- schema checks for objects holding web search items --------------------------------------


def _open_view(response: dict[str, Any]) -> dict[str, Any]:
    """Open Responses has no web_search tool or item: check the rest of the object there."""
    return {
        **response,
        "tools": [t for t in response["tools"] if t["type"] != "web_search"],
        "output": [o for o in response["output"] if o["type"] != "web_search_call"],
    }


def check_search_response(response: dict[str, Any]) -> None:
    check(response, OPENAI, "Response")
    check(_open_view(response), OPEN, "ResponseResource")


def check_search_event(event: dict[str, Any]) -> None:
    kind = event["type"]
    check(event, OPENAI, event_schemas(OPENAI)[kind])
    if kind.startswith("response.web_search_call."):
        return  # defined by OpenAI's document only
    if event.get("item", {}).get("type") == "web_search_call":
        return
    assert kind in event_schemas(OPEN), kind
    if "response" in event:
        event = {**event, "response": _open_view(event["response"])}
    check(event, OPEN, event_schemas(OPEN)[kind])


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def index(tmp_path: Path) -> LocalIndex:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorblax.md").write_text("# Zorblax lighthouse\n\nThe Zorblax lighthouse is painted teal.\n")
    (docs / "page.html").write_text(
        "<html><head><title>Harbour news</title><script>var x='zorblax';</script></head>"
        "<body><p>Boats &amp; ferries leave the harbour at dawn.</p></body></html>"
    )
    idx = LocalIndex(tmp_path / "index.sqlite3")
    idx.add([docs])
    return idx


def searching_engine(always: bool = False) -> ScriptedEngine:
    """Searches first; answers once the conversation ends in a tool result (unless ``always``)."""
    engine = ScriptedEngine()

    def pick(request: GenerationRequest) -> None:
        done = request.messages[-1].role == "tool"
        can = any(t.kind == "web_search" for t in request.tools)
        engine.script = Script(content=(), tool_calls=(SEARCH,)) if can and (always or not done) else Script()

    engine.on_generate = pick
    return engine


@pytest.fixture
def engine() -> ScriptedEngine:
    return searching_engine()


@pytest.fixture
def client(engine: ScriptedEngine, scripted_app: ScriptedApp, index: LocalIndex) -> Iterator[TestClient]:
    with scripted_app(engine, web_search_index=index.path) as c:
        yield c


# --- Chat Completions -------------------------------------------------------------------------

CHAT = "/v1/chat/completions"


def chat_body(messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"model": "kimi-k3.1-pro", "messages": messages, "tools": [{"type": "web_search"}], **kw}


def test_chat_loop_runs_the_search_server_side(client: TestClient, engine: ScriptedEngine, index: LocalIndex) -> None:
    user = {"role": "user", "content": "Search: what colour is the Zorblax lighthouse?"}
    first = client.post(CHAT, json=chat_body([user])).json()
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "builtin_function" and call["function"]["name"] == "$web_search"
    echo = {"role": "tool", "tool_call_id": call["id"], "content": call["function"]["arguments"]}
    second = client.post(CHAT, json=chat_body([user, choice["message"], echo]))
    assert second.status_code == 200, second.text
    seen = engine.requests[-1].messages[-1]
    assert seen.role == "tool" and "painted teal" in seen.text and "URL: doc:" in seen.text
    assert str(index.path.parent) not in seen.text  # the server's paths are nobody's business
    assert "var x" not in seen.text  # scripts are not indexed text
    assert second.json()["choices"][0]["message"]["content"] == "Hello there."


def test_the_search_result_reaches_the_default_models_prompt(client: TestClient, engine: ScriptedEngine) -> None:
    """After a search the indexed text is what the model reads: inside the tool-response turn of
    the default model's own chat template, right before the answer's opening. (How well the model
    answers from it is answer quality: benchmarks/answer_quality.py measures that, no test.)"""
    user = {"role": "user", "content": "Search: what colour is the Zorblax lighthouse?"}
    call = {"id": "call_ws1", "type": "builtin_function", "function": {"name": "$web_search", "arguments": SEARCH_ARGS}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    echo = {"role": "tool", "tool_call_id": "call_ws1", "content": SEARCH_ARGS}
    assert client.post(CHAT, json=chat_body([user, assistant, echo])).status_code == 200
    seen = engine.requests[-1]
    path = model_path(DEFAULT_MODEL)
    assert path.exists(), f"{path.name} is not pulled (scripts/test pulls it)"
    info = read_gguf_info(path)
    template = ChatTemplate(info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)
    prompt = template.render(seen.messages, tools=seen.tools)
    before, _, result = prompt.rpartition("<tool_response>")
    result, _, after = result.partition("</tool_response>")
    assert "zorblax" in before.lower()  # the question and the call come first
    assert "painted teal" in result and "URL: doc:" in result
    assert after.rstrip().endswith("<|im_start|>assistant"), after


def test_chat_search_streams_and_mixes_with_functions(client: TestClient, engine: ScriptedEngine) -> None:
    user = {"role": "user", "content": "Search the web."}
    r = client.post(
        CHAT,
        json=chat_body(
            [user],
            stream=True,
            tools=[
                {"type": "web_search"},
                {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
            ],
        ),
    )
    assert r.status_code == 200
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0]["type"] == "builtin_function" and calls[0]["function"]["name"] == "$web_search"
    kinds = [t.kind for t in engine.requests[-1].tools]
    assert kinds == ["function", "web_search"] or kinds == ["web_search", "function"]


def test_chat_web_search_errors(engine: ScriptedEngine, scripted_app: ScriptedApp, client: TestClient) -> None:
    user = {"role": "user", "content": "Hi"}
    with scripted_app(engine, web_search_provider="none") as off:
        r = off.post(CHAT, json=chat_body([user]))
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"
        assert "not enabled" in r.json()["error"]["message"]
    bad_name = {"type": "builtin_function", "function": {"name": "$fetch"}}
    r = client.post(CHAT, json=chat_body([user], tools=[bad_name]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.name"
    ok_name = {"type": "builtin_function", "function": {"name": "$web_search"}}
    assert client.post(CHAT, json=chat_body([user], tools=[ok_name])).status_code == 200
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "builtin_function", "function": {"name": "$web_search", "arguments": "{}"}}
        ],
    }
    echo = {"role": "tool", "tool_call_id": "c1", "content": "not json"}
    r = client.post(CHAT, json=chat_body([user, assistant, echo]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[2].content"


def test_a_plain_text_tool_message_searches_the_calls_own_query(client: TestClient, engine: ScriptedEngine) -> None:
    """The contract asks clients to echo the call's arguments but refuses nothing else: a tool
    message in plain text is answered, with the query of the call it answers."""
    user = {"role": "user", "content": "Search: what colour is the Zorblax lighthouse?"}
    call = {"id": "call_ws1", "type": "builtin_function", "function": {"name": "$web_search", "arguments": SEARCH_ARGS}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    plain = {"role": "tool", "tool_call_id": "call_ws1", "content": "here you go"}
    r = client.post(CHAT, json=chat_body([user, assistant, plain]))
    assert r.status_code == 200, r.text
    seen = engine.requests[-1].messages[-1]
    assert "painted teal" in seen.text and "here you go" not in seen.text


# --- Responses --------------------------------------------------------------------------------


def responses_body(**kw: Any) -> dict[str, Any]:
    return {
        "model": "kimi-k3.1-pro",
        "reasoning": {"effort": "low"},
        "input": "Search it.",
        "tools": [{"type": "web_search"}],
        **kw,
    }


INCLUDE = ["web_search_call.action.sources", "web_search_call.results"]


@pytest.mark.parametrize("include", [[], INCLUDE])
def test_responses_items_and_events_validate(client: TestClient, include: list[str], index: LocalIndex) -> None:
    r = client.post("/v1/responses", json=responses_body(include=include))
    assert r.status_code == 200, r.text
    data = r.json()
    check_search_response(data)
    assert [o["type"] for o in data["output"]] == ["web_search_call", "reasoning", "message"]
    item = data["output"][0]
    assert item["status"] == "completed" and item["action"]["query"] == "zorblax lighthouse colour"
    if include:
        assert item["action"]["sources"][0]["url"].startswith("doc:")
        assert str(index.path.parent) not in r.text
        assert "teal" in item["results"][0]["snippet"]
    else:
        assert "sources" not in item["action"] and "results" not in item
    s = client.post("/v1/responses", json=responses_body(include=include, stream=True))
    events = parse_sse(s.text)
    for e in events:
        check_search_event(e)
    types = [e["type"] for e in events]
    assert types[:6] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["response"]["output"][0]["type"] == "web_search_call"


def test_responses_search_budget_withdraws_the_tool(scripted_app: ScriptedApp, index: LocalIndex) -> None:
    engine = searching_engine(always=True)
    with scripted_app(engine, web_search_index=index.path, web_search_max_calls=2) as c:
        data = c.post("/v1/responses", json=responses_body()).json()
    assert [o["type"] for o in data["output"]] == ["web_search_call"] * 2 + ["reasoning", "message"]
    assert len(engine.requests) == 3
    assert not any(t.kind == "web_search" for t in engine.requests[-1].tools)
    assert data["usage"]["input_tokens"] == 3 * 12  # every round's prompt counts


def test_responses_search_beside_a_function_call(client: TestClient, engine: ScriptedEngine) -> None:
    weather = ToolCallDelta(1, "call_w", "get_weather", '{"city": "Oslo"}')
    engine.on_generate = None
    engine.script = Script(content=(), tool_calls=(SEARCH, weather))
    data = client.post("/v1/responses", json=responses_body(tools=[{"type": "web_search"}, weather_tool()])).json()
    check_search_response(data)
    assert [o["type"] for o in data["output"]] == ["web_search_call", "reasoning", "function_call"]


def test_failed_search_is_a_result_not_an_error(scripted_app: ScriptedApp) -> None:
    engine = searching_engine()
    # A SearXNG URL nothing listens on: the search fails, the response still completes.
    with scripted_app(
        engine, web_search_provider="searxng", web_search_url="http://127.0.0.1:9", web_search_timeout_s=2
    ) as c:
        data = c.post("/v1/responses", json=responses_body()).json()
    assert data["status"] == "completed"
    assert data["output"][0]["status"] == "failed"
    tool_text = engine.requests[-1].messages[-1].text
    assert "failed" in tool_text and "could not be reached" in tool_text
    check_search_response(data)


def test_responses_refused_without_provider(engine: ScriptedEngine, scripted_app: ScriptedApp) -> None:
    with scripted_app(engine, web_search_provider="none") as c:
        r = c.post("/v1/responses", json=responses_body())
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"


def test_output_with_search_items_replays_as_input(client: TestClient, engine: ScriptedEngine) -> None:
    first = client.post("/v1/responses", json=responses_body()).json()
    items = [{"role": "user", "content": "Search it."}, *first["output"], {"role": "user", "content": "Thanks!"}]
    before = len(engine.requests)
    r = client.post("/v1/responses", json=responses_body(input=items))
    assert r.status_code == 200, r.text
    roles = [m.role for m in engine.requests[before].messages]
    assert roles == ["user", "assistant", "user"]


# --- the ledger (gateway) ---------------------------------------------------------------------


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    import sqlite3

    with sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM usage ORDER BY created_at")]


def test_searches_are_billed_with_the_request_that_ran_them(
    tmp_path: Path, scripted_app: ScriptedApp, index: LocalIndex
) -> None:
    """Chat: the request whose tool message the server answers pays for the search (a cached
    repeat pays nothing). Responses: the search rounds of one request make one row."""
    engine = searching_engine()
    with scripted_app(engine, web_search_index=index.path) as c:
        user = {"role": "user", "content": "Search"}
        assistant = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "builtin_function", "function": {"name": "$web_search", "arguments": SEARCH_ARGS}}
            ],
        }
        echo = {"role": "tool", "tool_call_id": "c1", "content": SEARCH_ARGS}
        for _ in range(2):
            assert c.post(CHAT, json=chat_body([user, assistant, echo])).status_code == 200
    with scripted_app(searching_engine(), web_search_index=index.path) as c:  # a cold search cache
        r = c.post(
            "/v1/responses", json={"model": "kimi-k3.1-pro", "input": "Look it up", "tools": [{"type": "web_search"}]}
        )
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
    rows = _ledger(tmp_path)
    assert [row["web_search_calls"] for row in rows[:2]] == [1, 0]
    [responses_row] = [row for row in rows if row["endpoint"] == "responses"]
    assert responses_row["web_search_calls"] == 1
    assert responses_row["prompt_tokens"] == usage["input_tokens"]
    assert responses_row["completion_tokens"] == usage["output_tokens"]
    assert len({row["request_id"] for row in rows}) == len(rows) == 3


def test_output_budget_spans_every_round(scripted_app: ScriptedApp, index: LocalIndex) -> None:
    engine = searching_engine(always=True)
    with scripted_app(engine, web_search_index=index.path, web_search_max_calls=2) as c:
        c.post("/v1/responses", json=responses_body(max_output_tokens=20))
    budgets = [r.max_output_tokens for r in engine.requests]
    assert budgets[0] == 20 and budgets[1] < 20 and budgets[2] < budgets[1]
