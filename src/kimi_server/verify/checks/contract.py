"""The rules the two contracts disagree on (docs/contract.md, "Contract profiles"), each probed
both ways: what the contract under test accepts is sent and must be answered, what it refuses
must be refused, so an endpoint that follows the other contract fails here whichever way round.
Also what the endpoint says of itself (``contract`` in ``GET /models``).

Per model: a server may hold each model id to its own contract (a route's ``contract``).
"""

from __future__ import annotations

import json
from typing import Any

from kimi_server.verify.answers import reasoning_of, reasons_anyway
from kimi_server.verify.contracts import CONTRACTS, FIXED_TEMPERATURE, FIXED_TOP_P
from kimi_server.verify.outcome import Failed, Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ACCEPT_TOKENS, SAY_OK, Target, error_text

CHAT = "/chat/completions"
RESPONSES = "/responses"
NO_PARAMETERS = {"type": "object", "properties": {}}


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": SAY_OK, "max_completion_tokens": ACCEPT_TOKENS, **extra}


def _responses(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "input": SAY_OK[0]["content"], "max_output_tokens": ACCEPT_TOKENS, **extra}


def _accepted(t: Target, what: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = t.post(path, body)
    expect(resp.status_code == 200, f"{what}: refused, HTTP {resp.status_code}: {error_text(resp)}")
    answer: dict[str, Any] = resp.json()
    return answer


def _refused(t: Target, what: str, path: str, body: dict[str, Any], param: str) -> None:
    try:
        t.refused(path, body, param=param)
    except Failed as exc:
        raise Failed(f"{what}: {exc}") from None


@check("contract", "declared in GET /models", per_model=True)
def declared(t: Target, model: str) -> str:
    said = t.listed().get(model, {}).get("contract")
    if said is None:
        raise Skipped("GET /models does not say which contract the model follows")
    expect(said == t.contract.name, f"GET /models says {model} follows {said!r}, not {t.contract.name!r}")
    return str(said)


def _name(length: int) -> str:
    return ("lookup_" + "x" * length)[:length]


def _tool_bodies(model: str, name: str) -> list[tuple[str, str, dict[str, Any], str]]:
    """(where, path, body, the param a refusal names) for a tool of this name in each place."""
    function = {"type": "function", "function": {"name": name, "parameters": NO_PARAMETERS}}
    flat = {"type": "function", "name": name, "parameters": NO_PARAMETERS}
    system = {"role": "system", "content": "", "tools": [function]}
    return [
        ("request tools", CHAT, _chat(model, tools=[function]), "tools[0]"),
        ("system-message tools", CHAT, _chat(model, messages=[system, *SAY_OK]), "messages[0].tools[0].function.name"),
        ("Responses tools", RESPONSES, _responses(model, tools=[flat]), "tools[0]"),
    ]


@check("contract", "tool name length", per_model=True)
def tool_names(t: Target, model: str) -> str:
    limit = t.contract.tool_name_max
    for where, path, body, _ in _tool_bodies(model, _name(limit)):
        _accepted(t, f"a {limit}-character name in {where} (the {t.contract.name} limit)", path, body)
    for where, path, body, param in _tool_bodies(model, _name(limit + 1)):
        _refused(t, f"a {limit + 1}-character name in {where} (over the {t.contract.name} limit)", path, body, param)
    return f"{limit} characters accepted, {limit + 1} refused (request, system-message and Responses tools)"


@check("contract", "thinking switch", per_model=True)
def thinking_switch(t: Target, model: str) -> str:
    off = {"type": "disabled"}
    if t.contract.thinking_switch:
        temp = t.contract.non_thinking_temperature
        extra = {"temperature": temp} if temp is not None and t.rules(model).fixed_sampling else {}
        what = "thinking disabled" + (f" with temperature {temp:g}" if extra else "")
        answer = _accepted(t, what, CHAT, _chat(model, max_completion_tokens=16, thinking=off, **extra))
        expect(not reasoning_of(answer), "reasoning_content present with thinking disabled")
        details = (answer.get("usage") or {}).get("completion_tokens_details") or {}
        expect(not details.get("reasoning_tokens"), "reasoning_tokens > 0 with thinking disabled")
        _accepted(t, "thinking enabled", CHAT, _chat(model, thinking={"type": "enabled"}))
        return "disabled: no reasoning; enabled accepted"
    reasons_anyway(t, model)
    answer = _accepted(t, "thinking disabled", CHAT, _chat(model, max_completion_tokens=16, thinking=off))
    details = (answer.get("usage") or {}).get("completion_tokens_details") or {}
    expect(
        bool(reasoning_of(answer)) or bool(details.get("reasoning_tokens")),
        f"thinking disabled turned reasoning off: the {t.contract.name} contract ignores the field",
    )
    return "thinking disabled ignored: reasoning stays on"


# (value, the param a contract with the switch names when it refuses it)
ODD_THINKING: list[tuple[Any, str]] = [
    ({"type": "sometimes"}, "thinking.type"),
    ({"type": "enabled", "keep": "sometimes"}, "thinking.keep"),
    ("off", "thinking"),
]


@check("contract", "thinking values", per_model=True)
def thinking_values(t: Target, model: str) -> str:
    if t.contract.thinking_switch:
        for value, param in ODD_THINKING:
            _refused(t, f"thinking {json.dumps(value)}", CHAT, _chat(model, thinking=value), param)
        _refused(
            t,
            "Responses thinking type 'sometimes'",
            RESPONSES,
            _responses(model, thinking={"type": "sometimes"}),
            "thinking.type",
        )
        for keep in t.contract.thinking_keep:
            _accepted(t, f"thinking keep {keep!r}", CHAT, _chat(model, thinking={"type": "enabled", "keep": keep}))
        keeps = "".join(f", keep {k!r} accepted" for k in t.contract.thinking_keep)
        return f"other types, keeps and shapes refused (both endpoints){keeps}"
    for value, _ in ODD_THINKING:
        _accepted(t, f"thinking {json.dumps(value)}", CHAT, _chat(model, thinking=value))
    _accepted(t, "Responses thinking type 'sometimes'", RESPONSES, _responses(model, thinking={"type": "sometimes"}))
    return "any value accepted and ignored (both endpoints)"


@check("contract", "penalties", per_model=True)
def penalties(t: Target, model: str) -> str:
    fixed = t.contract.fixed_penalties and t.rules(model).fixed_sampling
    for name in ("presence_penalty", "frequency_penalty"):
        if fixed:
            _refused(t, f"{name} 0.5", CHAT, _chat(model, **{name: 0.5}), name)
        else:
            _accepted(t, f"{name} 0.5 (ignored under {t.contract.name})", CHAT, _chat(model, **{name: 0.5}))
    return "0.5 refused: fixed at 0" if fixed else "0.5 accepted and ignored"


@check("contract", "temperature with thinking disabled", per_model=True)
def non_thinking_temperature(t: Target, model: str) -> str:
    if not t.rules(model).fixed_sampling:
        raise Skipped("this model's sampling fields are not fixed under either contract")
    off = {"thinking": {"type": "disabled"}}
    temp = t.contract.non_thinking_temperature
    if t.contract.thinking_switch and temp is not None:
        body = _chat(model, temperature=temp, top_p=FIXED_TOP_P, **off)
        _accepted(t, f"temperature {temp:g} with thinking disabled", CHAT, body)
        body = _chat(model, temperature=FIXED_TEMPERATURE, **off)
        _refused(t, f"temperature {FIXED_TEMPERATURE:g} with thinking disabled", CHAT, body, "temperature")
        _refused(t, f"temperature {temp:g} with thinking on", CHAT, _chat(model, temperature=temp), "temperature")
        return f"{temp:g} without thinking, {FIXED_TEMPERATURE:g} with"
    body = _chat(model, temperature=FIXED_TEMPERATURE, **off)
    _accepted(t, f"temperature {FIXED_TEMPERATURE:g} with thinking disabled (the field ignored)", CHAT, body)
    others = {c.non_thinking_temperature for c in CONTRACTS.values() if c.non_thinking_temperature is not None}
    for other in sorted(others):
        body = _chat(model, temperature=other, **off)
        _refused(t, f"temperature {other:g} with thinking disabled (the field ignored)", CHAT, body, "temperature")
    return f"thinking ignored: only {FIXED_TEMPERATURE:g}"
