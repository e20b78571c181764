"""Structured output: ``response_format`` json_schema (plain and streamed) and json_object."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

from kimi_server.verify.outcome import Failed, Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ANSWER_TOKENS, Target

CHAT = "/chat/completions"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "result": {"type": "string", "enum": ["OK", "NO"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["result", "count"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "result", "strict": True, "schema": SCHEMA}}
ASK = [{"role": "user", "content": "Return a JSON object with result equal to OK and count equal to 3."}]


def _parsed(content: str | None, where: str) -> Any:
    try:
        return json.loads(content or "")
    except ValueError:
        raise Failed(f"{where}: the answer is not JSON: {(content or '')[:60]!r}") from None


def _body(t: Target, model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": ASK, "max_completion_tokens": ANSWER_TOKENS, **t.low_effort(model), **extra}


@check("structured", "json_schema")
def json_schema(t: Target, model: str) -> str:
    choice = t.ok(CHAT, _body(t, model, response_format=FORMAT))["choices"][0]
    expect(choice["finish_reason"] == "stop", f"finish_reason {choice['finish_reason']!r}")
    value = _parsed(choice["message"]["content"], "plain")
    errors = list(Draft202012Validator(SCHEMA).iter_errors(value))
    expect(not errors, f"the answer breaks the schema: {errors[0].message if errors else ''}")
    return json.dumps(value)


@check("structured", "json_schema streamed")
def json_schema_streamed(t: Target, model: str) -> None:
    chunks = t.stream_json(CHAT, _body(t, model, response_format=FORMAT, stream=True)).events
    text = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c.get("choices"))
    errors = list(Draft202012Validator(SCHEMA).iter_errors(_parsed(text, "streamed")))
    expect(not errors, f"the streamed answer breaks the schema: {errors[0].message if errors else ''}")


@check("structured", "json_object")
def json_object(t: Target, model: str) -> None:
    choice = t.ok(CHAT, _body(t, model, response_format={"type": "json_object"}))["choices"][0]
    expect(isinstance(_parsed(choice["message"]["content"], "json_object"), dict), "the answer is not a JSON object")


@check("structured", "malformed formats refused")
def refusals(t: Target, model: str) -> None:
    base = {"model": model, "messages": ASK, "max_completion_tokens": 1}
    t.refused(
        CHAT,
        {**base, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        param="response_format",
    )
    t.refused(CHAT, {**base, "response_format": {"type": "yaml"}}, param="response_format")


@check("structured", "Responses text.format")
def responses_format(t: Target, model: str) -> str:
    fmt = {"type": "json_schema", "name": "result", "schema": SCHEMA, "strict": True}
    body: dict[str, Any] = {"input": ASK[0]["content"], "max_output_tokens": ANSWER_TOKENS, "text": {"format": fmt}}
    refused = [m for m in t.models if not t.rules(m).structured_responses]
    for other in refused:  # the reference: structured output is K3.1 only
        t.refused("/responses", {**body, "model": other}, param="text.format")
    if not t.rules(model).structured_responses:
        raise Skipped("the model under test has no structured output")
    low = t.low_effort(model)
    effort = {"reasoning": {"effort": low["reasoning_effort"]}} if low else {}
    answer = t.ok("/responses", {**body, "model": model, **effort})
    texts = [
        p.get("text", "") for o in answer.get("output", []) if o.get("type") == "message" for p in o.get("content", [])
    ]
    errors = list(Draft202012Validator(SCHEMA).iter_errors(_parsed("".join(texts), "responses")))
    expect(not errors, f"the answer breaks the schema: {errors[0].message if errors else ''}")
    return "answer valid" + (f"; refused on {', '.join(refused)}" if refused else "")
