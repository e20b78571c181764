"""Parameter rules and their 400s, per model (the reference's model table). What the two
contracts disagree on (penalties, the temperature without thinking) is the ``contract`` group's."""

from __future__ import annotations

from typing import Any

from kimi_server.verify.contracts import FIXED_TEMPERATURE, FIXED_TOP_P
from kimi_server.verify.registry import check
from kimi_server.verify.target import ACCEPT_TOKENS, SAY_OK, Target

CHAT = "/chat/completions"


def _body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": SAY_OK, "max_completion_tokens": ACCEPT_TOKENS, **extra}


@check("params", "n=2 refused", per_model=True)
def n_two(t: Target, model: str) -> None:
    t.refused(CHAT, _body(model, n=2), param="n")


@check("params", "max_completion_tokens out of range refused", per_model=True)
def output_cap_range(t: Target, model: str) -> None:
    t.refused(CHAT, _body(model, max_completion_tokens=0), param="max_completion_tokens")
    t.refused(CHAT, _body(model, max_completion_tokens=1_048_577), param="max_completion_tokens")


@check("params", "empty messages refused", per_model=True)
def empty_messages(t: Target, model: str) -> None:
    t.refused(CHAT, {**_body(model), "messages": []}, param="messages")


@check("params", "default sampling values accepted", per_model=True)
def defaults_accepted(t: Target, model: str) -> None:
    extra: dict[str, Any] = {"temperature": FIXED_TEMPERATURE, "top_p": FIXED_TOP_P, "n": 1}
    if t.contract.fixed_penalties:
        extra |= {"presence_penalty": 0, "frequency_penalty": 0}
    t.chat(**_body(model, **extra))


@check("params", "temperature / top_p rules", per_model=True)
def sampling_rules(t: Target, model: str) -> str:
    if t.rules(model).fixed_sampling:
        for temperature in (0.3, -1, 5):
            t.refused(CHAT, _body(model, temperature=temperature), param="temperature")
        t.refused(CHAT, _body(model, top_p=0.8), param="top_p")
        return "only the fixed values"
    t.chat(**_body(model, temperature=0.3, top_p=0.8))
    return "other values accepted and ignored"


@check("params", "prompt_cache_options rules", per_model=True)
def cache_options(t: Target, model: str) -> str:
    opts = {"mode": "implicit", "ttl": "1h"}
    if not t.rules(model).cache_options:
        t.refused(CHAT, _body(model, prompt_cache_options=opts), param="prompt_cache_options")
        return "refused on this model"
    t.chat(**_body(model, prompt_cache_options=opts))
    t.refused(CHAT, _body(model, prompt_cache_options={"mode": "implicit", "ttl": "2h"}), param="ttl")
    return "5m / 1h accepted, others refused"
