"""The web_search_20250305 server tool in rounds within one request, on a scripted engine and a
real local index: the blocks in Anthropic's order, max_uses, the domain filters, the usage, and
a searched answer sent back reaching the model as it was when it searched."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import GenerationRequest, ToolCallDelta, ToolChoice
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.errors import InvalidRequestError
from kimi_server.search.local_index import LocalIndex
from kimi_server.search.searcher import Searcher
from kimi_server.serving import messages_search
from kimi_server.serving.messages import Event
from kimi_server.serving.messages_input import RESULT_SEAL
from kimi_server.serving.messages_request import MessagesPlan
from kimi_server.serving.messages_search import SearchingMessageBuilder
from kimi_server.serving.messages_tools import WebSearchOptions
from tests.messages_util import KEY, SEALER, body, plan
from tests.test_messages_builder import accumulated, normal, renamed, signatures

QUERY = "zorblax lighthouse colour"
SEARCH = ToolCallDelta(0, "call_ws1", "$web_search", f'{{"query": "{QUERY}"}}', "builtin_function")
ASK = {"role": "user", "content": "What colour is the Zorblax lighthouse?"}


@pytest.fixture
def searcher(tmp_path: Path) -> Searcher:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorblax.md").write_text("# Zorblax lighthouse\n\nThe Zorblax lighthouse is painted teal.\n")
    index = LocalIndex(tmp_path / "index.sqlite3")
    index.add([docs])
    return Searcher(index, max_results=5, token_budget=2000)


def searching_engine(*, always: bool = False, beside: ToolCallDelta | None = None) -> ScriptedEngine:
    """Searches while it may (and has not yet read a result, unless ``always``)."""
    engine = ScriptedEngine()

    def pick(request: GenerationRequest) -> None:
        can = any(t.kind == "web_search" for t in request.tools)
        searching = can and (always or request.messages[-1].role != "tool")
        calls = (SEARCH,) if beside is None else (SEARCH, beside)
        engine.script = Script(content=(), tool_calls=calls) if searching else Script()

    engine.on_generate = pick
    return engine


def search_plan(**tool: Any) -> MessagesPlan:
    search = {"type": "web_search_20250305", "name": "web_search", **tool}
    weather = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    return plan({**body(), "messages": [ASK], "tools": [search, weather]})


def run(
    p: MessagesPlan, engine: ScriptedEngine, searcher: Searcher, max_calls: int = 3
) -> tuple[list[Event], SearchingMessageBuilder]:
    builder = SearchingMessageBuilder(p, SEALER, searcher, max_calls=max_calls)

    async def go() -> list[Event]:
        first: AsyncGenerator[Any, None] = engine.generate(p.gen)
        return [e async for e in messages_search.stream(builder, engine, first)]

    return asyncio.run(go()), builder


def final_of(p: MessagesPlan, engine: ScriptedEngine, searcher: Searcher, max_calls: int = 3) -> dict[str, Any]:
    builder = SearchingMessageBuilder(p, SEALER, searcher, max_calls=max_calls)
    return asyncio.run(messages_search.complete(builder, engine, engine.generate(p.gen)))


def test_a_search_round_then_the_answer(searcher: Searcher) -> None:
    p = search_plan()
    engine = searching_engine()
    final = final_of(p, engine, searcher)
    kinds = [b["type"] for b in final["content"]]
    assert kinds == ["thinking", "server_tool_use", "web_search_tool_result", "thinking", "text"]
    use, result = final["content"][1:3]
    assert use["id"].startswith("srvtoolu_") and use["name"] == "web_search" and use["input"] == {"query": QUERY}
    assert result["tool_use_id"] == use["id"]
    [hit] = result["content"]
    assert (
        hit["type"] == "web_search_result"
        and hit["title"] == "Zorblax lighthouse"
        and hit["url"].startswith("doc:")  # a document id: never the server's path
    )
    assert "painted teal" in SEALER.open(hit["encrypted_content"], key_id=KEY, param="x", purpose=RESULT_SEAL)
    assert final["content"][4] == {"type": "text", "text": "Hello there."} and final["stop_reason"] == "end_turn"
    assert final["usage"]["server_tool_use"] == {"web_search_requests": 1, "web_fetch_requests": 0}
    # every round's output counts: 3 (reasoning, the call) + 4 (reasoning, the answer)
    assert final["usage"]["output_tokens"] == 7
    seen = engine.requests[-1].messages[-1]
    assert seen.role == "tool" and "painted teal" in seen.text
    # The stream, through the SDK's accumulator, is the same message.
    stream, builder = run(p, searching_engine(), searcher)
    assert builder.fresh_searches == 0  # the searcher's cache answered the same query again
    view, mine = accumulated(stream), normal(final)
    mine["id"] = view["id"]
    mine["usage"]["server_tool_use"] = view["usage"]["server_tool_use"]
    # the TTL split is not in the SDK's message_delta usage (test_messages_builder.py)
    mine["usage"]["cache_creation"] = view["usage"]["cache_creation"]
    signatures(mine, view)
    assert renamed(opened(view)) == renamed(opened(mine))


def opened(view: dict[str, Any]) -> dict[str, Any]:
    """Each result's sealed text (sealed afresh on every run) in place of its blob."""
    for block in view["content"]:
        for hit in block["content"] if block["type"] == "web_search_tool_result" else ():
            hit["encrypted_content"] = SEALER.open(hit["encrypted_content"], key_id=KEY, param="x", purpose=RESULT_SEAL)
    return view


def test_a_searched_answer_sent_back_is_the_conversation_the_model_had(searcher: Searcher) -> None:
    engine = searching_engine()
    final = final_of(search_plan(), engine, searcher)
    answering = engine.requests[-1].messages  # the question, the searching round, its result
    back = {
        **body(),
        "messages": [ASK, {"role": "assistant", "content": final["content"]}, {"role": "user", "content": "Thanks"}],
    }
    again = plan(back).gen.messages
    searched, result = again[1], again[2]
    assert dataclasses.replace(searched, tool_calls=()) == dataclasses.replace(answering[1], tool_calls=())
    assert searched.tool_calls[0].arguments == answering[1].tool_calls[0].arguments
    assert result.text == answering[2].text  # what it found, as it read it
    assert again[3].text == "Hello there." and again[3].reasoning == "Let me think."


def test_max_uses_and_the_servers_own_bound(searcher: Searcher) -> None:
    engine = searching_engine(always=True)
    final = final_of(search_plan(max_uses=1), engine, searcher, max_calls=3)
    results = [b["content"] for b in final["content"] if b["type"] == "web_search_tool_result"]
    assert len(results) == 3  # the server's bound on calls, then the tool is withdrawn
    assert isinstance(results[0], list)
    assert results[1:] == [{"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"}] * 2
    assert "max_uses for web search is spent" in engine.requests[-1].messages[-1].text
    assert all(t.kind != "web_search" for t in engine.requests[-1].tools)
    assert final["content"][-1] == {"type": "text", "text": "Hello there."}
    assert final["usage"]["server_tool_use"]["web_search_requests"] == 1


def test_domain_filters(searcher: Searcher) -> None:
    options = WebSearchOptions("tools[0]", allowed_domains=("example.com", "docs.rs/serde"))
    assert options.admits("https://example.com/a") and options.admits("https://www.example.com/")
    assert not options.admits("https://badexample.com/") and not options.admits("file:///tmp/x")
    assert options.admits("https://docs.rs/serde/latest") and not options.admits("https://docs.rs/tokio")
    blocked = WebSearchOptions("tools[0]", blocked_domains=("example.com",))
    assert not blocked.admits("https://sub.example.com/x") and blocked.admits("https://other.org/")
    # Local documents have no host: an allow-list keeps none of them.
    final = final_of(search_plan(allowed_domains=["example.com"]), searching_engine(), searcher)
    assert final["content"][2]["content"] == []
    final = final_of(search_plan(blocked_domains=["example.com"]), searching_engine(), searcher)
    assert len(final["content"][2]["content"]) == 1


def test_naming_web_search_forces_the_first_round_only(searcher: Searcher) -> None:
    search = {"type": "web_search_20250305", "name": "web_search"}
    p = plan({**body(), "messages": [ASK], "tools": [search], "tool_choice": {"type": "tool", "name": "web_search"}})
    assert p.gen.tool_choice == ToolChoice("named", WEB_SEARCH_NAME)
    engine = searching_engine()
    final = final_of(p, engine, searcher)
    assert [r.tool_choice for r in engine.requests] == [ToolChoice("named", WEB_SEARCH_NAME), ToolChoice("auto")]
    assert final["content"][-1] == {"type": "text", "text": "Hello there."}


def test_a_client_tool_called_beside_the_search_ends_the_turn(searcher: Searcher) -> None:
    weather = ToolCallDelta(1, "call_w", "get_weather", '{"city": "Paris"}')
    final = final_of(search_plan(), searching_engine(beside=weather), searcher)
    kinds = [b["type"] for b in final["content"]]
    assert kinds == ["thinking", "server_tool_use", "web_search_tool_result", "tool_use"]
    assert final["content"][-1]["input"] == {"city": "Paris"} and final["stop_reason"] == "tool_use"


def test_a_failing_round_ends_with_an_error_event(searcher: Searcher) -> None:
    engine = searching_engine()
    engine.script = Script(fail_after=1)
    engine.on_generate = None
    stream, _ = run(search_plan(), engine, searcher)
    assert stream[0][0] == "message_start" and stream[-1][0] == "error"


def test_web_search_needs_a_provider() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        messages_search.check_searcher(search_plan(), None)
    assert caught.value.param == "tools[0]"
    messages_search.check_searcher(plan(body()), None)
