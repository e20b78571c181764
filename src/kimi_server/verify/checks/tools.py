"""Function tools: each tool_choice, the 400s around them, streamed calls equal to plain ones,
and arguments valid against strict schemas over a small corpus."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

from kimi_server.verify.outcome import Failed, expect
from kimi_server.verify.registry import check
from kimi_server.verify.schemas import CORPUS, TIME, WEATHER, tool
from kimi_server.verify.target import ANSWER_TOKENS, Target

CHAT = "/chat/completions"
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


def ask(t: Target, model: str, *, stream: bool = False, **body: Any) -> dict[str, Any]:
    """A tool request; a stream is folded into the message a plain answer would carry."""
    # One call per answer: enough to judge, and small models otherwise repeat the call.
    full = {
        "model": model,
        "messages": ASK,
        "max_completion_tokens": ANSWER_TOKENS,
        "parallel_tool_calls": False,
        **t.low_effort(model),
        **body,
    }
    if not stream:
        choice: dict[str, Any] = t.ok(CHAT, full)["choices"][0]
        return choice
    calls: dict[int, dict[str, Any]] = {}
    content, finish = "", None
    for chunk in t.stream_json(CHAT, {**full, "stream": True}).events:
        for ch in chunk.get("choices") or []:
            delta = ch.get("delta") or {}
            content += delta.get("content") or ""
            finish = ch.get("finish_reason") or finish
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    part["index"], {"id": None, "type": None, "function": {"name": "", "arguments": ""}}
                )
                call["id"] = part.get("id") or call["id"]
                call["type"] = part.get("type") or call["type"]
                fn = part.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
    message = {"content": content, "tool_calls": [calls[i] for i in sorted(calls)] or None}
    return {"message": message, "finish_reason": finish}


def valid_calls(choice: dict[str, Any], schemas: dict[str, dict[str, Any]], *, where: str = "") -> list[str]:
    """The called names, failing unless every call is well formed and its arguments validate."""
    calls = choice["message"].get("tool_calls") or []
    expect(bool(calls), f"{where}no tool call (finish_reason {choice.get('finish_reason')!r})")
    expect(choice.get("finish_reason") == "tool_calls", f"{where}finish_reason {choice.get('finish_reason')!r}")
    names = []
    for call in calls:
        expect(bool(call.get("id")), f"{where}a call has no id")
        expect(call.get("type") == "function", f"{where}a call has type {call.get('type')!r}")
        name = call["function"]["name"]
        expect(name in schemas, f"{where}call to undeclared function {name!r}")
        try:
            args = json.loads(call["function"]["arguments"])
        except ValueError:
            raise Failed(f"{where}{name}: arguments are not JSON: {call['function']['arguments'][:60]!r}") from None
        errors = list(Draft202012Validator(schemas[name]).iter_errors(args))
        expect(not errors, f"{where}{name}: arguments break the schema: {errors[0].message if errors else ''}")
        names.append(name)
    return names


@check("tools", "auto without tools answered")
def auto_without_tools(t: Target, model: str) -> None:
    choice = ask(t, model, tool_choice="auto", max_completion_tokens=32)
    expect(not choice["message"].get("tool_calls"), "a tool call with no tools declared")


@check("tools", "auto")
def auto(t: Target, model: str) -> str:
    choice = ask(t, model, tools=[WEATHER, TIME], tool_choice="auto")
    if choice["message"].get("tool_calls"):
        return "called " + ", ".join(valid_calls(choice, SCHEMAS))
    expect(choice.get("finish_reason") in ("stop", "length"), f"finish_reason {choice.get('finish_reason')!r}")
    return "answered in text"


@check("tools", "none")
def none(t: Target, model: str) -> None:
    choice = ask(t, model, tools=[WEATHER], tool_choice="none", max_completion_tokens=64)
    expect(not choice["message"].get("tool_calls"), "tool_choice none, yet a tool was called")
    expect(choice.get("finish_reason") != "tool_calls", "finish_reason tool_calls under tool_choice none")


@check("tools", "required")
def required(t: Target, model: str) -> str:
    return "called " + ", ".join(valid_calls(ask(t, model, tools=[WEATHER], tool_choice="required"), SCHEMAS))


NAMED: dict[str, Any] = {
    "tools": [WEATHER, TIME],
    "tool_choice": {"type": "function", "function": {"name": "get_time"}},
}


def named_plain(t: Target, model: str) -> dict[str, Any]:
    """The named call, asked once: checked alone, and against its streamed twin."""
    return t.once(f"named:{model}", lambda: ask(t, model, **NAMED))


@check("tools", "named")
def named(t: Target, model: str) -> str:
    names = valid_calls(named_plain(t, model), SCHEMAS)
    expect(set(names) == {"get_time"}, f"named get_time, called {names}")
    return "called get_time"


@check("tools", "streamed == non-streamed")
def streamed_equal(t: Target, model: str) -> str:
    plain = valid_calls(named_plain(t, model), SCHEMAS, where="plain: ")
    streamed = valid_calls(ask(t, model, stream=True, **NAMED), SCHEMAS, where="streamed: ")
    expect(plain == streamed, f"plain called {plain}, streamed {streamed}")
    return f"{len(plain)} call(s) each, same shape"


@check("tools", "tool_choice refusals")
def refusals(t: Target, model: str) -> None:
    base = {"model": model, "messages": ASK, "max_completion_tokens": 1}
    t.refused(CHAT, {**base, "tool_choice": "required"}, param="tool_choice")
    other = {"type": "function", "function": {"name": "not_declared"}}
    t.refused(CHAT, {**base, "tools": [WEATHER], "tool_choice": other}, param="tool_choice")
    t.refused(CHAT, {**base, "tools": [WEATHER, WEATHER]}, param="tools")


@check("tools", "strict schema corpus")
def corpus(t: Target, model: str) -> str:
    for name, prompt, params in CORPUS:
        choice = ask(
            t,
            model,
            messages=[{"role": "user", "content": prompt}],
            tools=[tool(name, params)],
            tool_choice={"type": "function", "function": {"name": name}},
        )
        valid_calls(choice, {name: params}, where=f"{name}: ")
    return f"{len(CORPUS)} schemas"
