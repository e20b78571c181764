"""Prompted reasoning on the embedded engine, through the real server, the tiny model and the openai SDK:
effort orders the reasoning, no reasoning markers in answers, seed, the honest context window,
and the lenient max-tokens pair. Generations stay short (conftest's TEST_BUDGETS)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.shared_params import ReasoningEffort

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

MARKERS = ("<think>", "</think>", "<answer>", "</answer>")


def sdk(server: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=600)


def test_effort_orders_reasoning_on_every_prompt(live_server: LiveServer) -> None:
    prompts = ["Say hi.", "What is 2 + 2?", "Name a colour.", "Is water wet? Answer yes or no."]

    async def tokens(client: openai.AsyncOpenAI, prompt: str, effort: ReasoningEffort) -> int:
        resp = await client.chat.completions.create(
            model="kimi-k3.1-pro",
            messages=[{"role": "user", "content": prompt}],
            reasoning_effort=effort,
            max_completion_tokens=160,  # above the max cap: only the budgets bound reasoning
        )
        assert resp.usage is not None and resp.usage.completion_tokens_details is not None
        return resp.usage.completion_tokens_details.reasoning_tokens or 0

    async def main() -> list[list[int]]:
        async with sdk(live_server) as client:
            rows = [asyncio.gather(*(tokens(client, p, e) for e in ("low", "high", "max"))) for p in prompts]
            return [list(r) for r in await asyncio.gather(*rows)]

    for prompt, (low, high, max_) in zip(prompts, asyncio.run(main()), strict=True):
        assert 0 < low < high < max_, (prompt, low, high, max_)
        assert max_ >= 72, (prompt, max_)  # the max floor of TEST_BUDGETS holds


def test_no_marker_text_in_any_answer(live_server: LiveServer) -> None:
    """Prompts that invite the model to write the tags itself, over small caps, on both APIs,
    and in tool-call arguments."""
    echo = "Repeat exactly: <think>plan</think> <answer>42</answer> done </think>"
    tool: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {
            "name": "note",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    }

    async def main() -> list[str]:
        async with sdk(live_server) as client:
            chats = [
                client.chat.completions.create(
                    model="kimi-k3.1-pro",
                    messages=[{"role": "user", "content": echo}],
                    reasoning_effort="low",
                    max_completion_tokens=cap,
                )
                for cap in (12, 20, 28, 40, 60, 90)
            ]
            calls = [
                client.chat.completions.create(
                    model="kimi-k3.1-pro",
                    messages=[{"role": "user", "content": f"Save this note: {echo}"}],
                    reasoning_effort="low",
                    tools=[tool],
                    tool_choice="required",
                    max_completion_tokens=80,
                )
                for _ in range(2)
            ]
            responses = [
                client.responses.create(
                    model="kimi-k3.1-pro",
                    input=echo,
                    reasoning={"effort": "low"},
                    max_output_tokens=cap,
                )
                for cap in (16, 40, 70)
            ]
            texts: list[str] = []
            for resp in await asyncio.gather(*chats, *calls):
                message = resp.choices[0].message
                texts.append(message.content or "")
                texts += [c.function.arguments for c in message.tool_calls or [] if c.type == "function"]
            for r in await asyncio.gather(*responses):
                texts += [
                    part.text
                    for item in r.output
                    if item.type == "message"
                    for part in item.content
                    if part.type == "output_text"
                ]
            return texts

    texts = asyncio.run(main())
    assert len(texts) >= 11
    for text in texts:
        assert not any(m in text for m in MARKERS), text


def test_same_seed_gives_identical_output(live_server: LiveServer) -> None:
    """One after the other, as docs/contract.md promises (two at once share llama.cpp batches
    of a different shape, and may diverge: the docs say so)."""

    async def once(client: openai.AsyncOpenAI) -> tuple[str, str]:
        resp = await client.chat.completions.create(
            model="kimi-k3.1-pro",
            messages=[{"role": "user", "content": "Invent a name for a cat."}],
            reasoning_effort="low",
            max_completion_tokens=40,
            seed=1234,
        )
        message = resp.choices[0].message
        extra: dict[str, Any] = message.model_extra or {}
        return extra.get("reasoning_content") or "", message.content or ""

    async def main() -> list[tuple[str, str]]:
        async with sdk(live_server) as client:
            # The repeats find the prompt in the prompt cache: reuse must not change the output.
            return [await once(client) for _ in range(3)]

    results = asyncio.run(main())
    assert results[0][0] and results[0][1]
    assert all(r == results[0] for r in results), results


def test_models_report_the_engine_context_window_and_prompt_cap(live_server: LiveServer) -> None:
    async def main() -> tuple[list[Any], Any]:
        async with sdk(live_server) as client:
            listed = [m async for m in client.models.list()]
            return listed, await client.models.retrieve("kimi-k3.1-pro")

    listed, one = asyncio.run(main())
    assert listed
    for model in listed:
        assert (model.model_extra or {})["context_length"] == 16384  # conftest's --ctx-size
        # The default max_prompt_tokens: far below the window, so a client must be told it.
        assert (model.model_extra or {})["max_prompt_tokens"] == 8192
    assert (one.model_extra or {})["context_length"] == 16384
    assert (one.model_extra or {})["max_prompt_tokens"] == 8192


def test_prompt_too_long_names_the_field_used(live_server: LiveServer) -> None:
    long_text = "alpha beta gamma delta " * 6000  # far beyond the 16384-token window

    async def main() -> tuple[openai.BadRequestError, openai.BadRequestError]:
        async with sdk(live_server) as client:
            with pytest.raises(openai.BadRequestError) as responses:
                await client.responses.create(model="kimi-k3.1-pro", input=long_text)
            with pytest.raises(openai.BadRequestError) as chat:
                await client.chat.completions.create(
                    model="kimi-k3.1-pro", messages=[{"role": "user", "content": long_text}]
                )
            return responses.value, chat.value

    responses_error, chat_error = asyncio.run(main())
    for error, param in ((responses_error, "input"), (chat_error, "messages")):
        body = error.body
        assert isinstance(body, dict)
        assert body["param"] == param and body["code"] == "context_length_exceeded"
        assert "16384" in body["message"]


def test_both_max_fields_are_served_and_the_newer_wins(live_server: LiveServer) -> None:
    async def ask(max_tokens: int, max_completion_tokens: int) -> Any:
        async with sdk(live_server) as client:
            return await client.chat.completions.create(
                model="kimi-k3.1-pro",
                messages=[{"role": "user", "content": "Count to fifty."}],
                reasoning_effort="low",
                max_tokens=max_tokens,
                max_completion_tokens=max_completion_tokens,
            )

    # The newer field as the tighter cap: the output stays within it, not within max_tokens.
    tight = asyncio.run(ask(500, 10))
    assert tight.usage is not None and tight.usage.completion_tokens <= 10
    # The newer field as the looser cap: the low floor (8 tokens of reasoning in the test
    # budgets) is reached, which a cap of 4 from max_tokens would forbid.
    loose = asyncio.run(ask(4, 500))
    assert loose.usage is not None and loose.usage.completion_tokens > 4
