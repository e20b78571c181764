"""The ``tool_choice: "auto"`` decision: a short constrained step, separate from the answer.

Tiny models left to choose at the answer position rarely open a call: they answer in prose, or
write the call as a JSON code block. Asked directly whether a tool is needed, they are biased
(the 0.5B default model said "no" to everything, and named a tool for everything when asked
which one). What works is a few-shot decision over made-up tools, decoded greedily under a
grammar that admits only the tool names and ``none``: it tells greetings from weather requests
reliably with the default model. The examples use tools of their own so they favour no
particular request.

The step reads only the tools and the last user message, so it runs alongside the reasoning
phase. A conversation that ends in tool results is answered in text unless the reasoning itself
writes a call out.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence

from kimi_server.engines.llamacpp.grammar import CallSyntax
from kimi_server.engines.llamacpp.runner import CompletionResult, CompletionRunner
from kimi_server.engines.types import GenerationRequest, ToolSpec

_MAX_MESSAGE_CHARS = 1000
_MAX_DESCRIPTION_CHARS = 120

_EXAMPLES = """Decide for each message whether the assistant should call one of the listed tools \
or reply directly (none).

Tools: send_email (Sends an email), get_stock_price (Current price of a stock)
Message: Hi, how are you?
Decision: none

Tools: send_email (Sends an email), get_stock_price (Current price of a stock)
Message: Email Bob that I will be late.
Decision: send_email

Tools: search_flights (Finds flights between two cities)
Message: Write a short poem about autumn.
Decision: none

Tools: search_flights (Finds flights between two cities)
Message: Are there flights from Berlin to Rome tomorrow?
Decision: search_flights

Tools: convert_currency (Converts an amount between currencies)
Message: Thank you, that's all!
Decision: none

"""


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def decision_prompt(tools: Sequence[ToolSpec], message: str) -> str:
    listed = ", ".join(
        f"{t.name} ({_one_line(t.description, _MAX_DESCRIPTION_CHARS).rstrip('.')})" if t.description else t.name
        for t in tools
    )
    text = _one_line(message, _MAX_MESSAGE_CHARS)
    # The shared slot may reuse only the public examples: a fresh tag right after them makes
    # every later token of one request's prompt differ from any other's, so no tenant's tools or
    # message can be probed through another tenant's prompt-cache timing.
    tag = secrets.token_hex(4)
    return f"{_EXAMPLES}Case {tag}\nTools: {listed}\nMessage: {text}\nDecision:"


def decision_grammar(tools: Sequence[ToolSpec]) -> str:
    options = " | ".join(json.dumps(name) for name in [*(t.name for t in tools), "none"])
    return f'%llguidance {{}}\nstart: " " ({options})'


def last_user_text(request: GenerationRequest) -> str | None:
    """The message to decide on, or None when the conversation ends with tool results."""
    for message in reversed(request.messages):
        if message.role == "user":
            return message.text
        if message.role == "tool":
            return None
    return None


async def model_wants_call(
    runner: CompletionRunner,
    request: GenerationRequest,
    tools: Sequence[ToolSpec],
    *,
    slot: int | None = None,
) -> bool:
    message = last_user_text(request)
    if message is None:
        return False
    body: dict[str, object] = {
        "prompt": decision_prompt(tools, message),
        "n_predict": 8,
        "grammar": decision_grammar(tools),
        "temperature": 0.0,
        "cache_prompt": True,  # the examples are the same every time
    }
    if slot is not None:
        body["id_slot"] = slot
    text = ""
    async for item in runner.stream(body):
        if isinstance(item, CompletionResult):
            text = item.text
    # Only a tool name counts: anything else (even text a failed grammar let through) is "no".
    return text.strip() in {t.name for t in tools}


def just_answered(request: GenerationRequest) -> frozenset[str]:
    """Tools whose calls the conversation's last turn made and whose results end it."""
    messages = request.messages
    end = len(messages)
    while end and messages[end - 1].role == "tool":
        end -= 1
    if end == len(messages) or not end or messages[end - 1].role != "assistant":
        return frozenset()
    return frozenset(c.name for c in messages[end - 1].tool_calls)


def reasoning_writes_call(
    reasoning: str,
    tools: Sequence[ToolSpec],
    syntax: CallSyntax,
    answered: frozenset[str] = frozenset(),
) -> bool:
    """The reasoning already holds a call: the template's call marker, or a JSON object that
    names one of the tools. Right after results, the call just answered does not count: the
    reasoning's attempts, answering the conversation, were seen to write it out again (a small
    model repeating its search) rather than use its results."""
    fresh = [t for t in tools if t.name not in answered]
    marker = syntax.open.strip()
    if not answered and marker and marker in reasoning:
        return True
    names = "|".join(re.escape(t.name) for t in fresh)
    return bool(names) and re.search(rf'"name"\s*:\s*"({names})"', reasoning) is not None
