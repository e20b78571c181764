"""The Responses API: the response object and every streaming event valid against the Open
Responses specification, items and events in the documented order, usage arithmetic, calls."""

from __future__ import annotations

import json
from typing import Any

from kimi_server.verify.open_responses import event_schemas, problems
from kimi_server.verify.outcome import Failed, expect
from kimi_server.verify.registry import check
from kimi_server.verify.schemas import WEATHER
from kimi_server.verify.target import ANSWER_TOKENS, Target

PATH = "/responses"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def _body(t: Target, model: str, **extra: Any) -> dict[str, Any]:
    low = t.low_effort(model)
    effort = {"reasoning": {"effort": low["reasoning_effort"]}} if low else {}
    return {"model": model, "input": "Reply with OK.", "max_output_tokens": ANSWER_TOKENS, **effort, **extra}


def valid(instance: Any, schema: str, where: str) -> None:
    found = problems(instance, schema)
    expect(not found, f"{where} breaks Open Responses {schema}: {found[0] if found else ''}")


def check_response(r: dict[str, Any], where: str) -> None:
    valid(r, "ResponseResource", where)
    expect(r.get("store") is False, f"{where}: store is {r.get('store')!r}, always false")
    expect(r.get("status") in ("completed", "incomplete"), f"{where}: status {r.get('status')!r}")
    kinds = [o["type"] for o in r["output"]]
    if "reasoning" in kinds and "message" in kinds:
        expect(kinds.index("reasoning") < kinds.index("message"), f"{where}: output order {kinds}")
    u = r.get("usage") or {}
    i, o, tot = u.get("input_tokens", 0), u.get("output_tokens", 0), u.get("total_tokens", 0)
    expect(tot == i + o, f"{where}: total_tokens {tot} != input {i} + output {o}")
    reasoning = (u.get("output_tokens_details") or {}).get("reasoning_tokens", 0)
    expect(reasoning <= o, f"{where}: reasoning_tokens {reasoning} > output_tokens {o}")
    cached = (u.get("input_tokens_details") or {}).get("cached_tokens", 0)
    expect(cached <= i, f"{where}: cached_tokens {cached} > input_tokens {i}")


@check("responses", "response object")
def response_object(t: Target, model: str) -> str:
    r = t.ok(PATH, _body(t, model))
    check_response(r, "response")
    return "schema-valid; " + ", ".join(o["type"] for o in r["output"])


@check("responses", "stream events")
def stream_events(t: Target, model: str) -> str:
    events = t.stream_json(PATH, _body(t, model, stream=True)).events
    expect(len(events) >= 3, f"only {len(events)} events")
    kinds = [e.get("type") for e in events]
    expect(kinds[:2] == ["response.created", "response.in_progress"], f"the stream opens with {kinds[:2]}")
    expect(kinds[-1] in TERMINAL and all(k not in TERMINAL for k in kinds[:-1]), "no single terminal event last")
    seq = [e.get("sequence_number") for e in events]
    ints = [n for n in seq if isinstance(n, int)]
    expect(ints == seq and ints == sorted(set(ints)), "sequence_number not strictly increasing")
    known = event_schemas()
    open_items: dict[int, str] = {}
    for e in events:
        kind = str(e.get("type"))
        if kind not in known:
            raise Failed(f"event {kind!r} is not an Open Responses event")
        valid(e, known[kind], kind)
        if kind == "response.output_item.added":
            open_items[e["output_index"]] = e["item"]["type"]
        elif kind == "response.output_item.done":
            expect(open_items.pop(e["output_index"], None) == e["item"]["type"], "an item done that was never added")
    expect(not open_items, f"items added and never done: {sorted(open_items.values())}")
    final = events[-1]["response"]
    check_response(final, "final response")
    order = [o["type"] for o in final["output"]]
    return f"{len(events)} events, valid and in order; {', '.join(order)}"


@check("responses", "SDK reads the stream")
def sdk_stream(t: Target, model: str) -> str:
    body = _body(t, model)
    stream = t.sdk.responses.create(stream=True, **body)
    kinds = [event.type for event in stream]
    expect(bool(kinds) and kinds[-1] in TERMINAL, f"the SDK's last event is {kinds[-1:]!r}")
    return f"{len(kinds)} events"


@check("responses", "function call")
def function_call(t: Target, model: str) -> str:
    fn = WEATHER["function"]
    tool = {
        "type": "function",
        "name": fn["name"],
        "description": fn["description"],
        "parameters": fn["parameters"],
        "strict": True,
    }
    r = t.ok(
        PATH,
        _body(
            t,
            model,
            input="What is the weather in Paris right now?",
            tools=[tool],
            parallel_tool_calls=False,
            tool_choice={"type": "function", "name": fn["name"]},
        ),
    )
    valid(r, "ResponseResource", "response")
    calls = [o for o in r["output"] if o["type"] == "function_call"]
    expect(len(calls) >= 1, f"no function_call item in {[o['type'] for o in r['output']]}")
    expect(calls[0]["name"] == fn["name"] and bool(calls[0].get("call_id")), "the call lacks its name or call_id")
    try:
        json.loads(calls[0]["arguments"])
    except ValueError:
        raise Failed(f"arguments are not JSON: {calls[0]['arguments'][:60]!r}") from None
    return f"{len(calls)} function_call item(s)"


@check("responses", "input refusals")
def refusals(t: Target, model: str) -> None:
    base = {"model": model, "max_output_tokens": 1}
    t.refused(PATH, {**base, "input": "Hi", "reasoning": {"effort": "extreme"}}, param="reasoning.effort")
    t.refused(PATH, {**base, "input": []}, param="input")
    t.refused(PATH, {**base, "input": "Hi", "max_output_tokens": 0}, param="max_output_tokens")
