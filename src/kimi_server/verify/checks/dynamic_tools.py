"""Dynamic tools: ``tools`` declared in a ``system`` message (its content empty), callable from
there on beside the request's own tools, and each malformed declaration a 400 naming its field
(docs/contract.md, "Tools declared in system messages": both contracts take them)."""

from __future__ import annotations

from typing import Any

from kimi_server.verify.checks.tools import SCHEMAS, ask, valid_calls
from kimi_server.verify.outcome import expect
from kimi_server.verify.registry import check
from kimi_server.verify.schemas import TIME, WEATHER
from kimi_server.verify.target import ANSWER_TOKENS, Target

CHAT = "/chat/completions"
USER = {"role": "user", "content": "What is the weather in Paris right now?"}


def _system(*tools: Any, content: str = "") -> dict[str, Any]:
    return {"role": "system", "content": content, "tools": list(tools)}


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@check("dynamic_tools", "callable (required)")
def callable_required(t: Target, model: str) -> str:
    choice = ask(t, model, messages=[_system(WEATHER), USER], tool_choice="required")
    return "called " + ", ".join(valid_calls(choice, SCHEMAS))


@check("dynamic_tools", "callable streamed (named)")
def callable_streamed(t: Target, model: str) -> str:
    choice = ask(t, model, stream=True, messages=[_system(WEATHER), USER], tool_choice=_named("get_weather"))
    names = valid_calls(choice, SCHEMAS)
    expect(set(names) == {"get_weather"}, f"named get_weather, called {names}")
    return "called get_weather"


@check("dynamic_tools", "union with request tools")
def union(t: Target, model: str) -> str:
    choice = ask(t, model, messages=[_system(TIME), USER], tools=[WEATHER], tool_choice=_named("get_time"))
    names = valid_calls(choice, SCHEMAS)
    expect(set(names) == {"get_time"}, f"named the system message's get_time, called {names}")
    return "a system-message tool named beside request tools"


@check("dynamic_tools", "Responses system item")
def responses_item(t: Target, model: str) -> str:
    fn = WEATHER["function"]
    flat = {"type": "function", "name": fn["name"], "description": fn["description"], "parameters": fn["parameters"]}
    system: dict[str, Any] = {"type": "message", "role": "system", "content": "", "tools": [flat]}
    items = [system, {"type": "message", "role": "user", "content": USER["content"]}]
    low = t.low_effort(model)
    body = {
        "model": model,
        "input": items,
        "tool_choice": {"type": "function", "name": fn["name"]},
        "parallel_tool_calls": False,
        "max_output_tokens": ANSWER_TOKENS,
        **({"reasoning": {"effort": low["reasoning_effort"]}} if low else {}),
    }
    answer = t.ok("/responses", body)
    names = {o.get("name") for o in answer.get("output", []) if o.get("type") == "function_call"}
    expect(names == {fn["name"]}, f"function_call items {sorted(map(str, names))}")
    t.refused("/responses", {**body, "input": [{**items[0], "content": "Be brief."}, items[1]]}, param="input[0]")
    return "function_call get_weather; tools beside content refused"


def _bad(t: Target, model: str, messages: list[dict[str, Any]], param: str, **extra: Any) -> None:
    t.refused(CHAT, {"model": model, "messages": messages, "max_completion_tokens": 1, **extra}, param=param)


def _fn(name: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


@check("dynamic_tools", "misplaced declarations refused")
def misplaced(t: Target, model: str) -> str:
    _bad(t, model, [{**USER, "tools": [WEATHER]}], "messages[0].tools")
    assistant = {"role": "assistant", "content": "Sure.", "tools": [WEATHER]}
    _bad(t, model, [USER, assistant, USER], "messages[1].tools")
    _bad(t, model, [_system(WEATHER, content="Be brief."), USER], "messages[0].content")
    return "in user / assistant messages, and beside system content"


@check("dynamic_tools", "malformed entries refused")
def malformed(t: Target, model: str) -> str:
    longest = t.contract.tool_name_max
    entry = "messages[0].tools[0]"
    cases: list[tuple[Any, str]] = [
        ({"function": _fn("a")["function"]}, f"{entry}.type"),
        ({**_fn("a"), "type": "gadget"}, f"{entry}.type"),
        ({"type": "function"}, f"{entry}.function"),
        ({"type": "function", "function": {"parameters": {"type": "object"}}}, f"{entry}.function.name"),
        (_fn("1tool"), f"{entry}.function.name"),
        (_fn("bad name!"), f"{entry}.function.name"),
        (_fn(""), f"{entry}.function.name"),
        (_fn("a" * (longest + 1)), f"{entry}.function.name"),
        ("not an object", entry),
    ]
    for bad, field in cases:
        _bad(t, model, [_system(bad), USER], field)
    _bad(t, model, [{"role": "system", "content": "", "tools": {"not": "an array"}}, USER], "messages[0].tools")
    return f"{len(cases) + 1} malformed forms (names up to {longest} characters)"


@check("dynamic_tools", "duplicate names refused")
def duplicates(t: Target, model: str) -> str:
    _bad(t, model, [_system(WEATHER, WEATHER), USER], "messages[0].tools[1].function.name")
    _bad(t, model, [_system(WEATHER), _system(WEATHER), USER], "messages[1].tools[0].function.name")
    _bad(t, model, [_system(WEATHER), USER], "messages[0].tools[0].function.name", tools=[WEATHER])
    return "in one message, across messages, and beside request tools"
