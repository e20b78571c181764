"""The server's own search wording never comes back as an answer: the judge on its own, then
every door with the scripted engine answering a search with the server's instruction (as a
small model did in 1 of 14 streamed $web_search answers), and answers that must still pass."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import ContentDelta, EngineEvent, Finish, GenerationRequest, ToolCallDelta, Usage
from kimi_server.search.base import SearchHit, SearchOutcome
from kimi_server.search.local_index import LocalIndex
from kimi_server.search.searcher import RESULTS_FOOTER, Searcher, as_tool_text
from kimi_server.serving import messages_search
from kimi_server.serving.messages_search import SearchingMessageBuilder
from kimi_server.serving.search_echo import EchoedInstructionsError, EchoJudge, guard_answer
from tests.conftest import ScriptedApp
from tests.messages_util import SEALER
from tests.responses_util import parse_sse
from tests.test_messages_search import search_plan

OUTCOME = SearchOutcome(
    "zorblax lighthouse colour",
    (SearchHit("Zorblax lighthouse", "doc:0011", "The Zorblax lighthouse is painted teal."),),
)
WRITTEN = (as_tool_text(OUTCOME),)
JUDGE = EchoJudge(WRITTEN)
ECHOES = [
    RESULTS_FOOTER,
    "Sure! " + RESULTS_FOOTER,
    "answer the users question in your own words, from these results",  # reworded, same meaning
    "Web search results for 'zorblax lighthouse colour':",
    "Answer without it.",
    "Web search for 'zorblax lighthouse colour' found nothing.",
]
ANSWERS = [
    "The Zorblax lighthouse is painted teal.",
    "Teal.",
    "From these results: teal.",
    "Based on these results, the lighthouse is teal, as of the last repaint.",
    "The lighthouse is painted teal. " + RESULTS_FOOTER,  # an answer, quoting the server after it
]


@pytest.mark.parametrize("text", ECHOES)
def test_the_judge_knows_the_servers_wording(text: str) -> None:
    assert JUDGE.echoes(text)


@pytest.mark.parametrize("text", ANSWERS)
def test_answers_and_quotes_of_the_results_are_not_echoes(text: str) -> None:
    assert not JUDGE.echoes(text)


def test_the_servers_wording_is_cut_out_of_an_answer() -> None:
    assert JUDGE.cut("The lighthouse is teal. " + RESULTS_FOOTER) == "The lighthouse is teal."
    assert JUDGE.cut(RESULTS_FOOTER + " It is teal.") == "It is teal."
    assert JUDGE.cut("From these results: teal.") == "From these results: teal."  # too short a run


def _words(text: str) -> tuple[str, ...]:
    return tuple(w + " " for w in text.split())


async def _events(content: tuple[str, ...], calls: tuple[ToolCallDelta, ...] = ()) -> AsyncGenerator[EngineEvent, None]:
    for text in content:
        yield ContentDelta(text)
    for call in calls:
        yield call
    yield Finish("tool_calls" if calls else "stop", Usage(10, completion_tokens=len(content)))


async def _guarded(content: tuple[str, ...], calls: tuple[ToolCallDelta, ...] = ()) -> list[EngineEvent]:
    return [e async for e in guard_answer(_events(content, calls), JUDGE)]


def test_an_answer_streams_once_it_has_words_of_its_own() -> None:
    answer = _words("The Zorblax harbour lighthouse was given a fresh coat of teal paint")

    async def main() -> int:
        seen = 0
        async for event in guard_answer(_events(answer), JUDGE):
            if isinstance(event, ContentDelta):
                return seen
            seen += 1
        raise AssertionError("no content")

    # The first text comes out before the answer is over (held for a few words at most).
    assert asyncio.run(main()) == 0
    out = asyncio.run(_guarded(answer))
    assert "".join(e.text for e in out if isinstance(e, ContentDelta)) == "".join(answer)


def test_a_held_answer_loses_the_servers_wording_it_repeats() -> None:
    out = asyncio.run(_guarded(_words("It is teal. " + RESULTS_FOOTER)))
    assert [e.text for e in out if isinstance(e, ContentDelta)] == ["It is teal."]


def test_an_echo_is_never_returned_but_its_tool_calls_stand() -> None:
    with pytest.raises(EchoedInstructionsError):
        asyncio.run(_guarded(_words(RESULTS_FOOTER)))
    call = ToolCallDelta(0, "call_1", "get_weather", "{}")
    out = asyncio.run(_guarded(_words(RESULTS_FOOTER), (call,)))
    assert not [e for e in out if isinstance(e, ContentDelta)] and call in out and isinstance(out[-1], Finish)


# --- over HTTP, with a real local index ---------------------------------------------------------

CHAT = "/v1/chat/completions"
SEARCH_ARGS = '{"query": "zorblax lighthouse colour"}'
SEARCH = ToolCallDelta(0, "call_ws1", "$web_search", SEARCH_ARGS, "builtin_function")


@pytest.fixture
def index(tmp_path: Path) -> LocalIndex:
    (tmp_path / "zorblax.md").write_text("# Zorblax lighthouse\n\nThe Zorblax lighthouse is painted teal.\n")
    idx = LocalIndex(tmp_path / "index.sqlite3")
    idx.add([tmp_path / "zorblax.md"])
    return idx


def echoing_engine(answer: tuple[str, ...]) -> ScriptedEngine:
    """Searches while it may; after the results, answers with ``answer``."""
    engine = ScriptedEngine()

    def pick(request: GenerationRequest) -> None:
        searched = any(m.role == "tool" for m in request.messages)
        can = any(t.kind == "web_search" for t in request.tools)
        engine.script = Script(content=answer) if searched or not can else Script(content=(), tool_calls=(SEARCH,))

    engine.on_generate = pick
    return engine


@pytest.fixture
def echo_client(scripted_app: ScriptedApp, index: LocalIndex) -> Iterator[TestClient]:
    with scripted_app(echoing_engine(_words(RESULTS_FOOTER)), web_search_index=index.path) as c:
        yield c


def _after_search(stream: bool = False) -> dict[str, Any]:
    call = {"id": "call_ws1", "type": "builtin_function", "function": {"name": "$web_search", "arguments": SEARCH_ARGS}}
    return {
        "model": "kimi-k3.1-pro",
        "messages": [
            {"role": "user", "content": "Search: what colour is the Zorblax lighthouse?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_ws1", "content": SEARCH_ARGS},
        ],
        "tools": [{"type": "web_search"}],
        "stream": stream,
    }


def test_chat_never_answers_with_the_search_instruction(echo_client: TestClient) -> None:
    r = echo_client.post(CHAT, json=_after_search())
    assert r.status_code == 500 and r.json()["error"]["code"] == "answer_failed", r.text
    assert "own words" not in r.text
    s = echo_client.post(CHAT, json=_after_search(stream=True))
    chunks = [json.loads(line[6:]) for line in s.text.splitlines() if line.startswith("data: {")]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert content == "" and "own words" not in s.text
    assert chunks[-1]["error"]["code"] == "answer_failed"


def test_chat_answers_after_a_search_still_stream(scripted_app: ScriptedApp, index: LocalIndex) -> None:
    answer = _words("The Zorblax lighthouse is painted teal, the colour it has had since the last repaint.")
    with scripted_app(echoing_engine(answer), web_search_index=index.path) as c:
        plain = c.post(CHAT, json=_after_search()).json()
        assert plain["choices"][0]["message"]["content"] == "".join(answer)
        s = c.post(CHAT, json=_after_search(stream=True))
    chunks = [json.loads(line[6:]) for line in s.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert "".join(d for d in deltas if d) == "".join(answer)
    assert len([d for d in deltas if d]) > 1  # streamed in parts, not held to the end


@pytest.mark.parametrize("stream", [False, True])
def test_responses_never_answers_with_the_search_instruction(echo_client: TestClient, stream: bool) -> None:
    body = {"model": "kimi-k3.1-pro", "input": "Search it.", "tools": [{"type": "web_search"}], "stream": stream}
    r = echo_client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    final = parse_sse(r.text)[-1]["response"] if stream else r.json()
    assert final["status"] == "failed" and "own words" not in r.text
    assert [o["type"] for o in final["output"]][:1] == ["web_search_call"]


def test_messages_never_answers_with_the_search_instruction(index: LocalIndex) -> None:
    """The Messages door's search rounds end in the same guard."""
    p = search_plan()
    engine = echoing_engine(_words(RESULTS_FOOTER))
    builder = SearchingMessageBuilder(p, SEALER, Searcher(index, max_results=5, token_budget=2000), max_calls=3)
    with pytest.raises(EchoedInstructionsError):
        asyncio.run(messages_search.complete(builder, engine, engine.generate(p.gen)))
