"""A request's prompt is rendered through the chat template once: the count admission makes is
handed on to the generation (engines/llamacpp/rendered.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from kimi_server.engines.llamacpp.embedded_config import EmbeddedConfig
from kimi_server.engines.llamacpp.engine import EmbeddedEngine
from kimi_server.engines.llamacpp.rendered import Rendered, RenderedPrompts
from kimi_server.engines.types import Finish, GenerationRequest, Message, ReasoningBudget
from tests.conftest import TEST_MODEL, model_path


def ask(text: str) -> GenerationRequest:
    return GenerationRequest(
        model="kimi-k3.1-pro",
        messages=(Message("user", text),),
        effort="low",
        budget=ReasoningBudget(4, 8),
        max_output_tokens=12,
        seed=3,
    )


def test_a_count_is_taken_once_by_the_same_request_object_only() -> None:
    memo = RenderedPrompts(capacity=2)
    first, twin = ask("hi"), ask("hi")
    assert first == twin and first is not twin
    memo.keep(first, Rendered("P", 3))
    assert memo.take(twin) is None  # equal, but another request: rendered anew
    assert memo.take(first) == Rendered("P", 3)
    assert memo.take(first) is None  # once
    requests = [ask(str(i)) for i in range(3)]
    for r in requests:
        memo.keep(r, Rendered("P", 1))
    assert len(memo) == 2 and memo.take(requests[0]) is None  # the oldest count dropped


@pytest.mark.e2e
def test_the_embedded_engine_renders_a_counted_request_once() -> None:
    path = model_path(TEST_MODEL)
    assert path.exists(), f"{path.name} is not pulled (scripts/test pulls it)"

    async def main() -> tuple[int, int, int, int]:
        engine = EmbeddedEngine(EmbeddedConfig(path, n_ctx=2048, n_parallel=1, n_threads=1))
        renders: list[int] = []
        original = engine.template.render

        def counting(*args: Any, **kwargs: Any) -> str:
            renders.append(1)
            return original(*args, **kwargs)

        engine.template.render = counting  # type: ignore[method-assign]
        await engine.start()
        try:
            request = ask("Name a colour.")
            counted = await engine.count_prompt_tokens(request)
            assert counted is not None and len(renders) == 1
            before = len(renders)
            finish = [e async for e in engine.generate(request)][-1]
            with_count = len(renders) - before
            before = len(renders)
            # The same request anew, never counted: its generation renders the prompt itself.
            again = [e async for e in engine.generate(dataclasses.replace(request))][-1]
            without_count = len(renders) - before
            assert isinstance(finish, Finish) and isinstance(again, Finish)
            assert finish.usage.prompt_tokens == again.usage.prompt_tokens == counted
            return counted, with_count, without_count, len(engine._rendered)
        finally:
            await engine.close()

    _, with_count, without_count, left = asyncio.run(main())
    # Seeded, both take the same path (any answer step renders its own prompt with the draft,
    # the same in both); only the first call's render is saved.
    assert with_count == without_count - 1
    assert left == 0  # the count was taken, not left behind
