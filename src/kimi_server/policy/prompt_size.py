"""How big a prompt is, before anything is rendered or tokenized, and the bounds it must fit.

One count (``prompt_size``) serves both the 400 for a prompt that cannot fit the context
window (``check_prompt_size``) and the gateway's token reservation for an engine that cannot
count its prompts (``estimate_prompt_tokens``); ``check_prompt_tokens`` checks an engine's own
count once it has one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kimi_server.engines.types import GenerationRequest
from kimi_server.errors import InvalidRequestError
from kimi_server.settings import Settings

HOSTED_WINDOW = 1_048_576  # the Kimi API's context window, for upstreams that declare none
MEDIA_TOKENS = 768  # a generous guess at one image's or video's tokens
MESSAGE_TOKENS = 8  # the chat template's framing around one message


@dataclass(frozen=True)
class PromptLimits:
    max_messages: int
    max_parts: int
    max_chars: int
    window: int  # the engine's context window, in tokens

    @classmethod
    def from_settings(cls, s: Settings, window: int | None = None) -> PromptLimits:
        """``window``: the engine's own (an upstream's may be far larger than ``ctx_size``;
        one that is not configured gets the hosted API's)."""
        w = window or s.ctx_size
        return cls(
            max_messages=s.max_messages or max(1, w // 4),
            max_parts=s.max_content_parts or w,
            max_chars=s.max_prompt_chars or 8 * w,
            window=w,
        )


@dataclass(frozen=True)
class PromptSize:
    messages: int
    parts: int  # messages, images, videos and tool calls
    chars: int  # text, reasoning, tool calls and tool declarations
    media: int  # images and videos


def prompt_size(gen: GenerationRequest) -> PromptSize:
    """A request's prompt, counted without tokenizing anything."""
    parts = chars = media = 0
    for m in gen.messages:
        media += len(m.images) + len(m.videos)
        parts += 1 + len(m.images) + len(m.videos) + len(m.tool_calls)
        chars += len(m.text) + len(m.reasoning or "")
        chars += sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    for tool in gen.tools:
        chars += len(tool.name) + len(tool.description or "")
        if tool.parameters is not None:
            chars += len(json.dumps(tool.parameters, ensure_ascii=False))
    return PromptSize(len(gen.messages), parts, chars, media)


def estimate_prompt_tokens(gen: GenerationRequest) -> int:
    """A generous guess at the prompt's tokens (≈ 3 characters a token, plus framing), for an
    engine that cannot count them."""
    size = prompt_size(gen)
    return size.chars // 3 + MESSAGE_TOKENS * size.messages + MEDIA_TOKENS * size.media + 16


def check_prompt_size(gen: GenerationRequest, limits: PromptLimits, *, param: str) -> None:
    """A 400 at once for a prompt that cannot fit the context window, whatever its tokens."""
    size = prompt_size(gen)
    if size.messages > limits.max_messages:
        raise too_many_messages(size.messages, limits.max_messages, param)
    if size.parts > limits.max_parts:
        raise InvalidRequestError(
            f"'{param}' has {size.parts} parts (messages, content parts and tool calls); this server "
            f"accepts at most {limits.max_parts} in one request.",
            param=param,
            code="too_many_parts",
        )
    if size.chars > limits.max_chars:
        raise InvalidRequestError(
            f"'{param}' holds {size.chars} characters, more than this model's context window of "
            f"{limits.window} tokens can take ({limits.max_chars} characters at most). Shorten "
            "the conversation.",
            param=param,
            code="context_length_exceeded",
        )


def too_many_messages(count: int, limit: int, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"'{param}' has {count} messages; this server accepts at most {limit} in one request.",
        param=param,
        code="too_many_messages",
    )


def check_prompt_tokens(
    tokens: int, gen: GenerationRequest, limits: PromptLimits, *, bound: int | None, param: str
) -> None:
    """The prompt's real token count against the window, with room for the least output the
    request must be able to give (its reasoning floor and one answer token, or its whole output
    cap where that is smaller), then against the operator's bound on one prompt."""
    room = min(gen.max_output_tokens, gen.budget.floor + 1)
    if tokens + room > limits.window:
        raise InvalidRequestError(
            f"'{param}' is {tokens} tokens long; with {room} tokens of output it needs "
            f"{tokens + room}, more than this model's context window of {limits.window} tokens. "
            "Shorten the conversation.",
            param=param,
            code="context_length_exceeded",
        )
    if bound is not None and tokens > bound:
        raise InvalidRequestError(
            f"'{param}' is {tokens} tokens long; this server takes prompts of at most {bound} "
            "tokens on this model (max_prompt_tokens). Shorten the conversation.",
            param=param,
            code="context_length_exceeded",
        )
