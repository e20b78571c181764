"""Reasoning formats: the streaming <think> splitter and the format registry."""

from __future__ import annotations

import pytest

from kimi_server.parsers.reasoning import ThinkTagSplitter, get_reasoning_format


def split(chunks: list[str], *, opened: bool = False) -> tuple[str, str]:
    splitter = ThinkTagSplitter(get_reasoning_format("think-tags"), opened=opened)
    pieces = [p for c in chunks for p in splitter.feed(c)] + splitter.flush()
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    content = "".join(t for k, t in pieces if k == "content")
    return reasoning, content


TEXT = "<think>I should add.</think>\n\nThe sum is 5."


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 100])
def test_any_chunking_gives_the_same_split(size: int) -> None:
    chunks = [TEXT[i : i + size] for i in range(0, len(TEXT), size)]
    assert split(chunks) == ("I should add.", "The sum is 5.")


def test_no_think_block_is_all_content() -> None:
    assert split(["Just ", "an answer."]) == ("", "Just an answer.")


def test_prompt_that_already_opened_the_block() -> None:
    assert split(["deep thought</th", "ink>answer"], opened=True) == ("deep thought", "answer")


def test_unclosed_block_is_all_reasoning() -> None:
    assert split(["<think>still thinking <", "/thi"]) == ("still thinking </thi", "")


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown reasoning format"):
        get_reasoning_format("telepathy")
