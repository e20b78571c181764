"""The repetition guard: a generation looping on one n-gram ends with ``finish_reason: "length"``
long before its cap (unit checks of the detector, then the real model through the real server)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from kimi_server.engines.llamacpp.repetition import RepetitionGuard, RepetitionLimits
from kimi_server.engines.llamacpp.runner import CompletionResult, CompletionRunner
from tests.conftest import LiveServer, start_server, stop_server


def first_loop(pieces: list[str], limits: RepetitionLimits) -> int | None:
    """How many pieces the guard let through before it called a loop; None: never."""
    guard = RepetitionGuard(limits)
    for n, piece in enumerate(pieces, 1):
        if guard.looping(piece):
            return n
    return None


def test_a_repeated_ngram_is_a_loop_once_it_spans_enough_tokens() -> None:
    limits = RepetitionLimits(max_ngram=8, min_repeats=4, min_tokens=20)
    # One token over and over: a loop at the 20th.
    assert first_loop(["1"] * 50, limits) == 20
    # A 6-token phrase after some free text: a loop once the phrase has repeated over 24 tokens.
    phrase = ["The", " sky", " is", " red", ".", " "]
    assert first_loop([f"w{i}" for i in range(10)] + phrase * 10, limits) == 10 + 24
    # A unit longer than max_ngram is not watched.
    assert first_loop([f"u{i}" for i in range(9)] * 10, limits) is None


def test_varied_text_and_short_repeats_are_not_loops() -> None:
    limits = RepetitionLimits(max_ngram=8, min_repeats=4, min_tokens=20)
    assert first_loop([f"t{i % 37}-{i // 37}" for i in range(500)], limits) is None
    # "0, 0, 0" a few times is ordinary text; the run breaks before min_tokens.
    assert first_loop((["0", ","] * 8 + ["x"]) * 10, limits) is None
    assert first_loop(["1"] * 500, RepetitionLimits(max_ngram=0)) is None  # the guard is off


class ChunkServer:
    """Streams ``pieces`` as llama.cpp does (with per-token timings), then ends with ``end``."""

    def __init__(self, pieces: list[str], end: dict[str, Any]) -> None:
        self.pieces, self.end = pieces, end

    def handle_completions(self, body: dict[str, Any], callback: Any = None) -> Any:
        assert body["timings_per_token"]
        for n, piece in enumerate(self.pieces, 1):
            timings = {"cache_n": 3, "prompt_n": 7, "predicted_n": n}
            if callback({"choices": [{"text": piece, "finish_reason": None}], "timings": timings}):
                return None
        return self.end


def run_call(server: ChunkServer, stop_after: Any = None) -> list[str | CompletionResult]:
    async def go() -> list[str | CompletionResult]:
        runner = CompletionRunner(server)
        try:
            return [item async for item in runner.stream({"prompt": "p", "n_predict": 100}, stop_after)]
        finally:
            runner.shutdown()

    return asyncio.run(go())


def test_a_cut_call_reports_the_tokens_it_made() -> None:
    guard = RepetitionGuard(RepetitionLimits(max_ngram=4, min_repeats=4, min_tokens=10))
    items = run_call(ChunkServer(["a", "b"] + ["x"] * 50, {}), guard.looping)
    *pieces, result = items
    assert len(pieces) == 12 and isinstance(result, CompletionResult)
    assert (result.finish_reason, result.cut, result.looped, result.completion_tokens) == ("length", True, True, 12)
    assert (result.prompt_tokens, result.cached_tokens) == (10, 3)
    # The shared KV cache running out part-way: the tokens made are still counted.
    full = {"error": {"message": "Context size has been exceeded."}}
    *pieces, result = run_call(ChunkServer(["w"] * 9, full))
    assert isinstance(result, CompletionResult) and (result.completion_tokens, result.cut, result.looped) == (
        9,
        True,
        False,
    )


LOOP_PROMPT = "Write 1 on each line forever.\n" + "1\n" * 60  # SmolLM2 copies the pattern on
CAP = 400


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[LiveServer]:
    # A seeded sample is the same only on an engine in the same state: the shared server's KV
    # layout after other tests shifts the logits enough to change which tokens are drawn.
    proc, server = start_server(tmp_path)
    try:
        yield server
    finally:
        stop_server(proc)


@pytest.mark.e2e
def test_a_looping_answer_ends_with_length_far_below_its_cap(fresh_server: LiveServer) -> None:
    """SmolLM2 answers this seeded prompt with "1" over and over: without the guard it runs to
    the cap (400 tokens); with it, the stream ends with "length" about 100 tokens into the loop."""
    client = openai.OpenAI(base_url=fresh_server.base_url, api_key=fresh_server.key, max_retries=0)
    stream = client.chat.completions.create(
        model="kimi-k3.1-pro",
        messages=[{"role": "user", "content": LOOP_PROMPT}],
        reasoning_effort="low",
        max_completion_tokens=CAP,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    content: list[str] = []
    reasons: list[str] = []
    said: list[str] = []
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
                said.append((choice.model_extra or {}).get("stopped_by", ""))
        usage = chunk.usage or usage
    text = "".join(content)
    assert reasons == ["length"] and said == ["repetition_guard"]  # the guard's, not the cap's
    assert usage is not None and usage.completion_tokens < CAP - 100, usage
    assert len(set(text[-80:])) <= 3, text[-80:]  # it did end inside the loop
