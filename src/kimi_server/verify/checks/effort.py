"""Reasoning effort levels and their aliases (the ``thinking`` switch is the ``contract`` group's)."""

from __future__ import annotations

from kimi_server.verify.answers import reasons_anyway
from kimi_server.verify.contracts import K31_ALIASES
from kimi_server.verify.outcome import Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ACCEPT_TOKENS, SAY_OK, Target

CHAT = "/chat/completions"


@check("effort", "levels accepted", per_model=True)
def levels(t: Target, model: str) -> str:
    for level in t.rules(model).efforts:
        t.chat(model=model, reasoning_effort=level, max_completion_tokens=ACCEPT_TOKENS)
    return " / ".join(t.rules(model).efforts)


@check("effort", "aliases accepted")
def aliases(t: Target, model: str) -> str:
    names = t.rules(model).aliases
    if not names:
        raise Skipped("the contract gives this model no effort aliases")
    for alias in names:
        t.chat(model=model, reasoning_effort=alias, max_completion_tokens=ACCEPT_TOKENS)
    return " / ".join(names)


@check("effort", "other levels refused", per_model=True)
def refused(t: Target, model: str) -> str:
    body = {"model": model, "messages": SAY_OK, "max_completion_tokens": ACCEPT_TOKENS}
    t.refused(CHAT, {**body, "reasoning_effort": "extreme"}, param="reasoning_effort")
    wrong = [e for e in ("low", "high", *K31_ALIASES) if e not in t.rules(model).efforts + t.rules(model).aliases]
    for level in wrong[:2]:
        t.refused(CHAT, {**body, "reasoning_effort": level}, param="reasoning_effort")
    return "unknown" + (f", {', '.join(wrong[:2])}" if wrong else "")


@check("effort", "effort none keeps reasoning on")
def none_keeps_reasoning(t: Target, model: str) -> str:
    if "none" not in t.rules(model).aliases:
        raise Skipped("the contract gives this model no 'none' alias")
    reasons_anyway(t, model)
    answer = t.chat(model=model, max_completion_tokens=64, reasoning_effort="none")
    details = (answer.get("usage") or {}).get("completion_tokens_details") or {}
    expect(details.get("reasoning_tokens", 0) > 0, "no reasoning tokens: effort 'none' turned reasoning off")
    return "reasoning_tokens > 0"
