"""The ``$web_search`` builtin: the call comes back as a ``builtin_function``, its arguments
echoed as a tool message get a final answer. An endpoint that says search is not configured
skips these checks, with its own words as the reason."""

from __future__ import annotations

import json
from typing import Any

from kimi_server.verify.outcome import Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ANSWER_TOKENS, Target, error_shape

CHAT = "/chat/completions"
ASK = {"role": "user", "content": "Use web search to find the official Kimi homepage URL."}
BUILTIN = {"type": "builtin_function", "function": {"name": "$web_search"}}


def _search(t: Target, model: str, tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": messages,
        "tools": tools,
        "max_completion_tokens": ANSWER_TOKENS,
        **t.low_effort(model),
    }
    resp = t.post(CHAT, body)
    if resp.status_code == 400:
        error = error_shape(resp)
        raise Skipped(f"the endpoint does not search: {error['message'][:120]}")
    expect(resp.status_code == 200, f"HTTP {resp.status_code}")
    choice: dict[str, Any] = resp.json()["choices"][0]
    return choice


@check("web_search", "round trip")
def round_trip(t: Target, model: str) -> str:
    messages: list[dict[str, Any]] = [ASK]
    choice = _search(t, model, [{"type": "web_search"}], messages)
    calls = choice["message"].get("tool_calls") or []
    if not calls:
        expect(choice["finish_reason"] in ("stop", "length"), f"finish_reason {choice['finish_reason']!r}")
        return "the model answered without searching"
    call = calls[0]
    expect(call.get("type") == "builtin_function", f"the search call has type {call.get('type')!r}")
    expect(call["function"]["name"] == "$web_search", f"the search call is named {call['function']['name']!r}")
    args = json.loads(call["function"]["arguments"])
    expect(isinstance(args, dict) and bool(args.get("query")), "the search arguments carry no query")
    messages += [
        {**choice["message"], "role": "assistant"},
        {"role": "tool", "tool_call_id": call["id"], "name": "$web_search", "content": call["function"]["arguments"]},
    ]
    final = _search(t, model, [{"type": "web_search"}], messages)
    expect(final["finish_reason"] in ("stop", "length", "tool_calls"), f"finish_reason {final['finish_reason']!r}")
    return f"searched {args['query'][:40]!r}, then answered"


@check("web_search", "builtin_function spelling")
def builtin_spelling(t: Target, model: str) -> None:
    body = {"model": model, "messages": [ASK], "tools": [BUILTIN], "max_completion_tokens": 1}
    resp = t.post(CHAT, body)
    if resp.status_code == 400:
        raise Skipped(f"the endpoint does not search: {error_shape(resp)['message'][:120]}")
    expect(resp.status_code == 200, f"HTTP {resp.status_code}")


@check("web_search", "unknown builtin refused")
def unknown_builtin(t: Target, model: str) -> None:
    tools = [{"type": "builtin_function", "function": {"name": "$no_such_tool"}}]
    t.refused(CHAT, {"model": model, "messages": [ASK], "tools": tools, "max_completion_tokens": 1}, param="tools[0]")
