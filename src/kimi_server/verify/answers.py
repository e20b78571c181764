"""Answers several checks inspect, asked once per run (the target's memo)."""

from __future__ import annotations

from typing import Any

from kimi_server.verify.outcome import Skipped
from kimi_server.verify.target import ANSWER_TOKENS, SAY_OK, Streamed, Target


def basic(t: Target, model: str) -> dict[str, Any]:
    """A short plain answer at the model's lowest effort."""
    return t.once(
        f"basic:{model}", lambda: t.chat(model=model, max_completion_tokens=ANSWER_TOKENS, **t.low_effort(model))
    )


def basic_stream(t: Target, model: str) -> Streamed:
    """The same request streamed, with usage."""
    body = {
        "model": model,
        "messages": SAY_OK,
        "max_completion_tokens": ANSWER_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        **t.low_effort(model),
    }
    return t.once(f"stream:{model}", lambda: t.stream_json("/chat/completions", body))


def reasoning_of(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"].get("reasoning_content") or "")


def reasons_anyway(t: Target, model: str) -> None:
    """Skips a check about reasoning when the endpoint's model produced none at all."""
    answer = basic(t, model)
    details = (answer.get("usage") or {}).get("completion_tokens_details") or {}
    if not reasoning_of(answer) and not details.get("reasoning_tokens"):
        raise Skipped(
            "the model answered with no reasoning at all (an engine without a thinking mode): "
            "reasoning rules cannot be judged here"
        )
