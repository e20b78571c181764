"""Structured output and tool calls end to end: the real server, the real tiny model
(smollm2-135m) and the official openai SDK.

The promise under test: a strict structured answer or strict tool-call arguments always parse
and validate, streaming or not, whatever the model would rather have written.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, Field

from tests.conftest import LiveServer
from tests.schema_corpus import Outcome, Schema, check, corpus, features, representative, run_corpus

pytestmark = pytest.mark.e2e

MODEL = "kimi-k3.1-pro"
COMMON: dict[str, Any] = {"model": MODEL, "reasoning_effort": "low", "max_completion_tokens": 320}
# The suite runs a subset that uses every keyword, type and format the 120-schema corpus uses;
# KIMI_CORPUS_FULL=1 runs the whole corpus through every combination (see MODES).
FULL = os.environ.get("KIMI_CORPUS_FULL") == "1"
CORPUS = corpus()
# Every feature the corpus uses (6 schemas cover them) and 4 more spread over it.
SCHEMAS = CORPUS if FULL else representative(CORPUS, size=10)


@pytest.fixture(scope="module")
def sdk(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url, api_key=live_server.key, max_retries=0, timeout=600)


def ask(i: int) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"Fill in example data for record {i}."}]


def structured(sdk: openai.OpenAI, stream: bool) -> Any:
    def one(i: int, schema: Schema) -> Outcome:
        fmt = {"type": "json_schema", "json_schema": {"name": f"record_{i}", "strict": True, "schema": schema}}
        kwargs: dict[str, Any] = {**COMMON, "messages": ask(i), "response_format": fmt}
        if not stream:
            r = sdk.chat.completions.create(**kwargs)
            return Outcome(i, r.choices[0].message.content, str(r.choices[0].finish_reason))
        text, finish = "", ""
        for chunk in sdk.chat.completions.create(**kwargs, stream=True):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return Outcome(i, text, finish)

    return one


def tool_args(sdk: openai.OpenAI, stream: bool) -> Any:
    def one(i: int, schema: Schema) -> Outcome:
        tool = {
            "type": "function",
            "function": {
                "name": f"save_record_{i}",
                "strict": True,
                "description": "Saves one record.",
                "parameters": schema,
            },
        }
        kwargs: dict[str, Any] = {
            **COMMON,
            "messages": ask(i),
            "tools": [tool],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
        if not stream:
            r = sdk.chat.completions.create(**kwargs)
            calls = r.choices[0].message.tool_calls or []
            if len(calls) != 1 or calls[0].function.name != f"save_record_{i}":
                return Outcome(i, None, str(r.choices[0].finish_reason), f"calls: {calls}")
            return Outcome(i, calls[0].function.arguments, str(r.choices[0].finish_reason))
        args, finish, names = "", "", []
        for chunk in sdk.chat.completions.create(**kwargs, stream=True):
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or ():
                    if call.function and call.function.name:
                        names.append(call.function.name)
                    args += (call.function.arguments or "") if call.function else ""
                finish = choice.finish_reason or finish
        if names != [f"save_record_{i}"] or finish != "tool_calls":
            return Outcome(i, None, finish, f"streamed names {names}, finish {finish}")
        return Outcome(i, args, finish)

    return one


# Each schema goes through both paths (answer and tool arguments), streamed on one and not on
# the other, so every schema and both transports are covered in half the requests. Set
# KIMI_CORPUS_FULL=1 to run every schema of the corpus through every combination.
MODES = ["alternate", "plain", "stream"] if FULL else ["alternate"]


def streamed(mode: str, i: int, offset: int) -> bool:
    return mode == "stream" or (mode == "alternate" and (i + offset) % 2 == 0)


def by_mode(make: Any, sdk: openai.OpenAI, mode: str, offset: int) -> Any:
    plain, stream = make(sdk, False), make(sdk, True)
    return lambda i, schema: (stream if streamed(mode, i, offset) else plain)(i, schema)


@pytest.mark.parametrize("mode", MODES)
def test_corpus_strict_response_format_always_validates(sdk: openai.OpenAI, mode: str) -> None:
    assert len(CORPUS) >= 100
    assert set().union(*map(features, SCHEMAS)) == set().union(*map(features, CORPUS))
    failures = run_corpus(SCHEMAS, by_mode(structured, sdk, mode, 0))
    assert failures == [], "\n".join(failures)


@pytest.mark.parametrize("mode", MODES)
def test_corpus_strict_tool_arguments_always_validate(sdk: openai.OpenAI, mode: str) -> None:
    failures = run_corpus(SCHEMAS, by_mode(tool_args, sdk, mode, 1))
    assert failures == [], "\n".join(failures)


TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two integers.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": -100, "maximum": 100},
                    "b": {"type": "integer", "minimum": -100, "maximum": 100},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def valid_call(name: str, arguments: str) -> None:
    assert name in PARAMS
    why = check(PARAMS[name], Outcome(0, arguments, "tool_calls"))
    assert why is None, why


@pytest.mark.parametrize("choice", ["required", "get_weather", "add"])
def test_required_and_named_choice_always_yield_valid_calls(sdk: openai.OpenAI, choice: str) -> None:
    tool_choice: Any = choice if choice == "required" else {"type": "function", "function": {"name": choice}}

    def ask_one(question: str) -> Any:
        return sdk.chat.completions.create(
            **COMMON, messages=[{"role": "user", "content": question}], tools=TOOLS, tool_choice=tool_choice
        )

    questions = ("What is the weather in Oslo?", "Hello!", "What is 2 plus 3?")
    with ThreadPoolExecutor(len(questions)) as pool:  # the server decodes them together
        replies = list(pool.map(ask_one, questions))
    for r in replies:
        choice0 = r.choices[0]
        assert choice0.finish_reason == "tool_calls"
        calls = choice0.message.tool_calls or []
        assert len(calls) >= 1
        for call in calls:
            assert call.id.startswith("call_") and call.type == "function"
            if choice != "required":
                assert call.function.name == choice
            valid_call(call.function.name, call.function.arguments)


def test_streamed_calls_reassemble_to_the_non_streamed_calls(sdk: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        **COMMON,
        "seed": 1234,
        "tools": TOOLS,
        "tool_choice": "required",
        "messages": [{"role": "user", "content": "Weather in Lima, and 4 plus 5?"}],
    }
    # With a seed every call computes its whole prompt (no prompt-cache reuse), so calls one
    # after another compute the same numbers and sample the same tokens.
    sdk.chat.completions.create(**kwargs)
    plain = sdk.chat.completions.create(**kwargs)
    expected = [(c.function.name, c.function.arguments) for c in plain.choices[0].message.tool_calls or []]
    assert expected
    calls: dict[int, list[str]] = {}
    ids: dict[int, str] = {}
    finish = None
    for chunk in sdk.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                if delta.id:
                    assert delta.index not in ids, "id and name come first, once"
                    ids[delta.index] = delta.id
                    assert delta.function is not None and delta.function.name
                    calls[delta.index] = [delta.function.name, ""]
                assert delta.function is not None
                calls[delta.index][1] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert all(i.startswith("call_") for i in ids.values())
    assert [tuple(calls[i]) for i in sorted(calls)] == expected


class Person(BaseModel):
    # Bounded, so the tiny model cannot ramble past the token budget inside a string.
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    languages: list[Literal["python", "rust", "go", "c"]] = Field(max_length=3)


def test_sdk_parse_returns_a_parsed_object(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.parse(
        **COMMON, messages=[{"role": "user", "content": "Invent a programmer."}], response_format=Person
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Person), r.choices[0].message.content


def test_json_object_mode_yields_an_object(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(
        **COMMON,
        seed=3,
        messages=[{"role": "user", "content": "Give a cat's name and age as a JSON object."}],
        response_format={"type": "json_object"},
    )
    # Only an answer cut off by the token cap can be incomplete; this one has room to finish.
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_tool_results_feed_back_into_the_next_turn(sdk: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Rome?"}]
    first = sdk.chat.completions.create(
        **COMMON, messages=messages, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    msg = first.choices[0].message
    assert msg.tool_calls
    messages.append(msg.model_dump(exclude_none=True))  # keeps reasoning_content, as told
    assert messages[-1]["reasoning_content"] is not None
    for call in msg.tool_calls:
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "clear"})}
        )
    second = sdk.chat.completions.create(**COMMON, messages=messages, tools=TOOLS, tool_choice="none")
    assert second.choices[0].finish_reason in ("stop", "length")
    assert not second.choices[0].message.tool_calls
    # The history really reached the prompt: it is longer than the same request without it
    # (the first turn's own prompt is no yardstick: its tool_choice renders differently).
    alone = sdk.chat.completions.create(**COMMON, messages=messages[:1], tools=TOOLS, tool_choice="none")
    assert second.usage and alone.usage
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 20


@pytest.mark.parametrize(
    "schema",
    [
        {"allOf": [{"type": "string"}, {"type": "integer"}]},  # no value fits
        {"type": "string", "pattern": "^a\\Z"},  # fine for Python's re, not for the grammar's regex
    ],
    ids=["unsatisfiable", "regex-dialect"],
)
def test_a_schema_the_compiler_rejects_is_a_400_before_streaming(sdk: openai.OpenAI, schema: Schema) -> None:
    fmt: ResponseFormatJSONSchema = {
        "type": "json_schema",
        "json_schema": {"name": "x", "strict": True, "schema": schema},
    }

    def send(stream: bool) -> None:
        r = sdk.chat.completions.create(**COMMON, messages=ask(0), response_format=fmt, stream=stream)
        if stream:
            list(r)

    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            send(stream)
        body = info.value.body
        assert isinstance(body, dict) and body.get("code") == "invalid_schema", body
        assert body.get("param") == "response_format", body


# An answer this schema allows cannot fit in a few tokens: every answer below is cut.
LONG: Schema = {
    "type": "object",
    "properties": {
        "story": {"type": "string", "minLength": 120, "maxLength": 400},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 8},
        "done": {"type": "boolean"},
        "level": {"enum": ["low", "high"]},
    },
    "required": ["story", "scores", "done", "level"],
    "additionalProperties": False,
}
CUT_CAPS = (10, 16, 24)  # max_completion_tokens far below what any answer needs


def cut_request(kind: str, cap: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        **COMMON,
        "max_completion_tokens": cap,
        "messages": [{"role": "user", "content": "Write a long story, then score it."}],
    }
    if kind == "answer":
        fmt = {"name": "story", "strict": True, "schema": LONG}
        kwargs["response_format"] = {"type": "json_schema", "json_schema": fmt}
    elif kind == "json_object":
        kwargs["response_format"] = {"type": "json_object"}
    else:
        tool = {"type": "function", "function": {"name": "save_story", "strict": True, "parameters": LONG}}
        kwargs.update(tools=[tool], tool_choice="required")
    return kwargs


def cut_answer(sdk: openai.OpenAI, kind: str, cap: int, stream: bool, **extra: Any) -> tuple[str, str, list[str]]:
    """(the answer's JSON text, finish_reason, the names of the calls) of one request."""
    kwargs = {**cut_request(kind, cap), **extra}
    if not stream:
        r = sdk.chat.completions.create(**kwargs)
        calls = r.choices[0].message.tool_calls or []
        text = calls[0].function.arguments if calls else r.choices[0].message.content
        return text or "", str(r.choices[0].finish_reason), [c.function.name for c in calls]
    text, finish, names = "", "", []
    for chunk in sdk.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                names += [call.function.name] if call.function and call.function.name else []
                text += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    return text, finish, names


@pytest.mark.parametrize("kind", ["answer", "call"])
def test_a_strict_answer_cut_by_the_cap_is_closed_to_a_valid_value(sdk: openai.OpenAI, kind: str) -> None:
    runs = [(cap, stream) for cap in CUT_CAPS for stream in (False, True)]
    with ThreadPoolExecutor(len(runs)) as pool:
        outcomes = list(pool.map(lambda run: cut_answer(sdk, kind, *run), runs))
    for (cap, stream), (text, finish, names) in zip(runs, outcomes, strict=True):
        where = f"cap {cap}, {'streamed' if stream else 'whole'}: {text!r}"
        assert finish == "length", where
        assert names == (["save_story"] if kind == "call" else []), where
        assert check(LONG, Outcome(0, text, finish)) is None, where


def test_a_json_object_answer_cut_by_the_cap_is_closed_to_an_object(sdk: openai.OpenAI) -> None:
    text, finish, _ = cut_answer(sdk, "json_object", 10, False, seed=5)
    assert finish == "length"
    assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("kind", ["answer", "call"])
def test_a_cut_answer_streams_what_it_returns_whole(sdk: openai.OpenAI, kind: str) -> None:
    # With a seed every call computes its whole prompt, so calls one after another sample alike.
    whole = cut_answer(sdk, kind, 16, False, seed=77)
    streamed = cut_answer(sdk, kind, 16, True, seed=77)
    assert whole == streamed and whole[1] == "length"
