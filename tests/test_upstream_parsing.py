"""The relay's incremental parsers on hostile chunk boundaries: SSE framing, think tags and Kimi
tool-call markup split anywhere, one byte at a time."""

from __future__ import annotations

from typing import Any

from kimi_server.engines.types import ContentDelta, Finish, ReasoningDelta, ToolCallDelta
from kimi_server.engines.upstream.markup import KimiToolMarkup, ThinkSplitter
from kimi_server.engines.upstream.normalise import Normaliser
from kimi_server.engines.upstream.sse import SSEParser


def test_sse_parser_handles_crlf_multiline_comments_and_any_split() -> None:
    raw = b': keep-alive\r\n\r\nevent: x\r\ndata: {"a":\r\ndata: 1}\r\n\r\ndata:[DONE]\n\n'
    for size in (1, 2, 3, 7, len(raw)):
        parser = SSEParser()
        out: list[bytes] = []
        for i in range(0, len(raw), size):
            out += parser.feed(raw[i : i + size])
        assert out == [b'{"a":\n1}', b"[DONE]"]
        assert not parser.pending()
    parser = SSEParser()
    parser.feed(b'data: {"a"')
    assert parser.pending()  # a stream cut here is truncated


def test_sse_parser_one_event_per_read_matches_byte_by_byte() -> None:
    """A read holding exactly one event takes a shortcut; what comes out is what the same bytes
    give one at a time, including the shapes the shortcut must not take."""
    reads = [
        b"data: {}\n\n",
        b"data: x\r\n\n",
        b"data: a\ndata: b\n\n",
        b"data: \n\n",
        b"data:y\n\n",
        b"data: z\r\n\r\n",
        b"data: half",
        b" done\n\n",
        b": ping\n\n",
        b"data: [DONE]\n\n",
    ]
    whole, single = SSEParser(), SSEParser()
    by_read = [out for read in reads for out in whole.feed(read)]
    by_byte = [out for read in reads for i in range(len(read)) for out in single.feed(read[i : i + 1])]
    assert by_read == by_byte
    assert by_read[:3] == [b"{}", b"x", b"a\nb"]


def test_think_tags_split_at_every_byte() -> None:
    kimi_tags = "\u25c1think\u25b7Let me think.\u25c1/think\u25b7Hello there."  # SGLang's Kimi delimiters
    for text in ("<think>Let me think.</think>\n\nHello there.", kimi_tags):
        splitter = ThinkSplitter()
        parts = [p for ch in text for p in splitter.feed(ch)] + splitter.flush()
        reasoning = "".join(t for kind, t in parts if kind == "reasoning")
        content = "".join(t for kind, t in parts if kind == "content")
        assert (reasoning, content) == ("Let me think.", "Hello there.")
    splitter = ThinkSplitter()
    assert splitter.feed("<thi") == []  # could still be a tag
    assert splitter.feed("s is text") == [("content", "<this is text")]


def test_kimi_markup_split_at_every_byte_keeps_text_and_calls() -> None:
    text = (
        "Checking. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>'
        "functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
    )
    markup = KimiToolMarkup()
    content, calls = "", []
    for ch in text:
        plain, found = markup.feed(ch)
        content += plain
        calls += found
    content += markup.flush()
    assert content == "Checking. "
    assert [(c.index, c.name, c.arguments) for c in calls] == [
        (0, "get_weather", '{"city": "Paris"}'),
        (1, "get_time", "{}"),
    ]
    assert all(c.id and c.id.startswith("call_") for c in calls)


def test_normaliser_mixes_native_deltas_and_a_whole_completion() -> None:
    n = Normaliser(report_cache=True, separate_writes=True)
    events = n.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "reasoning_content": "Hm.",
                        "content": "",
                        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    },
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 6}},
        }
    )
    finish = n.finish()[-1]
    assert events == [ReasoningDelta("Hm."), ToolCallDelta(0, "a", "f", "{}")]
    assert isinstance(finish, Finish) and finish.reason == "tool_calls"
    usage = finish.usage
    assert (usage.prompt_tokens, usage.cached_tokens, usage.cache_write_tokens) == (10, 6, 4)
    plain = Normaliser(report_cache=False, separate_writes=True)
    plain.feed({"choices": [{"delta": {"content": "x"}}]})
    last = plain.finish()[-1]
    assert isinstance(last, Finish) and last.usage.cached_tokens == 0
    assert ContentDelta("x") not in plain.finish()  # nothing is emitted twice


class _NoShortcut:
    """A think splitter that never says the stream is plain: the normaliser's general path."""

    plain = False

    def __init__(self) -> None:
        self._inner = ThinkSplitter()

    def feed(self, text: str) -> Any:
        return self._inner.feed(text)

    def flush(self) -> Any:
        return self._inner.flush()


def test_normaliser_plain_text_shortcut_matches_the_general_path() -> None:
    """Plain content skips the tag splitters once the stream is known to be plain; the events are
    the same as the splitters give: text with '<', a tool-call section (text inside it dropped),
    a tag held back in part while the next piece has no '<', thinking tags after plain text."""
    texts = [
        "Hello",
        " there",
        " a < b",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0",
        "<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "dropped in the section",
        "<|tool_calls_section_end|>",
        " after <|to",
        "ol_call_begin|>functions.g:1",
        "<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "<|tool_calls_section_end|> tail",
        " ◁think▷ plain",
        " <think>not a tag now</think>",
    ]
    stream = [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in texts]

    def run(shortcut: bool) -> list[Any]:
        normaliser = Normaliser(report_cache=False, separate_writes=False)
        if not shortcut:
            normaliser._think = _NoShortcut()  # type: ignore[assignment]
        out: list[Any] = []
        for chunk in stream:
            out += normaliser.feed(chunk)
        out += normaliser.finish()
        return [
            (type(e).__name__, getattr(e, "text", None), getattr(e, "name", None), getattr(e, "arguments", None))
            for e in out
        ]

    assert run(True) == run(False)
    assert ("ToolCallDelta", None, "g", "{}") in run(True)
