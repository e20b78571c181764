"""The schema corpus through the Responses endpoint: strict ``text.format`` answers and strict
function-call arguments always validate, streamed or not (real server, real tiny model, openai
SDK). Each schema goes through one path here (answers on even indices, tool arguments on odd),
alternating transports; the Chat Completions corpus covers every schema on both paths. The
suite runs the same representative subset as the chat test (KIMI_CORPUS_FULL=1: all of it)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import LiveServer
from tests.schema_corpus import Outcome, Schema, check, run_corpus
from tests.test_structured_e2e import CORPUS, LONG, SCHEMAS, Person

pytestmark = pytest.mark.e2e

COMMON: dict[str, Any] = {
    "model": "kimi-k3.1-pro",
    "reasoning": {"effort": "low"},
    "max_output_tokens": 320,
}


@pytest.fixture(scope="module")
def sdk(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url, api_key=live_server.key, max_retries=0, timeout=600)


def final_response(sdk: openai.OpenAI, stream: bool, **kwargs: Any) -> Any:
    if not stream:
        return sdk.responses.create(**kwargs)
    final = None
    for event in sdk.responses.create(**kwargs, stream=True):
        if event.type in ("response.completed", "response.incomplete", "response.failed"):
            final = event.response
    return final


def one(sdk: openai.OpenAI) -> Any:
    def run(i: int, schema: Schema) -> Outcome:
        stream = (i // 2) % 2 == 0
        prompt = f"Fill in example data for record {i}."
        if i % 2 == 0:
            fmt = {"type": "json_schema", "name": f"record_{i}", "strict": True, "schema": schema}
            r = final_response(sdk, stream, **COMMON, input=prompt, text={"format": fmt})
            if r is None:
                return Outcome(i, None, "none", "no final event")
            return Outcome(i, r.output_text, r.status)
        tool = {"type": "function", "name": f"save_record_{i}", "strict": True, "parameters": schema}
        r = final_response(
            sdk, stream, **COMMON, input=prompt, tools=[tool], tool_choice="required", parallel_tool_calls=False
        )
        calls = [item for item in (r.output if r else []) if item.type == "function_call"]
        if len(calls) != 1 or calls[0].name != f"save_record_{i}":
            return Outcome(i, None, r.status if r else "none", f"calls: {calls}")
        return Outcome(i, calls[0].arguments, r.status)

    return run


def test_corpus_through_responses_always_validates(sdk: openai.OpenAI) -> None:
    assert len(CORPUS) >= 100
    failures = run_corpus(SCHEMAS, one(sdk))
    assert failures == [], "\n".join(failures)


def test_responses_parse_returns_a_parsed_object(sdk: openai.OpenAI) -> None:
    r = sdk.responses.parse(**COMMON, input="Invent a programmer.", text_format=Person)
    assert isinstance(r.output_parsed, Person), r.output_text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_strict_answer_cut_by_the_cap_is_incomplete_but_valid(sdk: openai.OpenAI, stream: bool) -> None:
    fmt = {"type": "json_schema", "name": "story", "strict": True, "schema": LONG}
    kwargs = {**COMMON, "max_output_tokens": 16}
    r = final_response(sdk, stream, **kwargs, input="Write a long story, then score it.", text={"format": fmt})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert check(LONG, Outcome(0, r.output_text, r.status)) is None, r.output_text
