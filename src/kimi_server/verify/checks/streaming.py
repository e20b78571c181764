"""Chat streams: SSE framing, reasoning strictly before the answer, the usage chunk, and the
``openai`` SDK reading the same stream."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionChunk

from kimi_server.verify.answers import basic_stream, reasons_anyway
from kimi_server.verify.outcome import expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ANSWER_TOKENS, SAY_OK, Target


def _deltas(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c["choices"][0].get("delta") or {} for c in chunks if c.get("choices")]


@check("streaming", "SSE framing")
def framing(t: Target, model: str) -> str:
    s = basic_stream(t, model)
    expect(s.done, "the stream did not end with data: [DONE]")
    expect(bool(s.events), "the stream carried no chunks")
    objects = {c.get("object") for c in s.events}
    expect(objects == {"chat.completion.chunk"}, f"chunk objects {sorted(map(str, objects))}")
    expect(len({c.get("id") for c in s.events}) == 1, "the chunks do not share one id")
    deltas = _deltas(s.events)
    expect(bool(deltas) and deltas[0].get("role") == "assistant", "the first delta carries no role: assistant")
    finishes = [
        c["choices"][0]["finish_reason"] for c in s.events if c.get("choices") and c["choices"][0].get("finish_reason")
    ]
    expect(len(finishes) == 1, f"{len(finishes)} chunks carry a finish_reason (one expected)")
    expect(finishes[0] in ("stop", "length"), f"finish_reason {finishes[0]!r}")
    return f"{len(s.events)} chunks, finish_reason {finishes[0]}"


@check("streaming", "reasoning before content")
def reasoning_first(t: Target, model: str) -> str:
    reasons_anyway(t, model)
    kinds = []
    for d in _deltas(basic_stream(t, model).events):
        if d.get("reasoning_content"):
            kinds.append("r")
        if d.get("content"):
            kinds.append("c")
    expect("r" in kinds, "no reasoning_content delta in the stream")
    if "c" in kinds:
        first_content = kinds.index("c")
        expect("r" not in kinds[first_content:], "reasoning_content arrived after content had started")
        return "every reasoning delta before the first content delta"
    return "reasoning only (the answer was cut by the output cap)"


@check("streaming", "usage chunk last")
def usage_chunk(t: Target, model: str) -> str:
    chunks = basic_stream(t, model).events
    last = chunks[-1] if chunks else {}
    expect(last.get("choices") == [], "the last chunk does not have choices: []")
    expect(isinstance(last.get("usage"), dict), "the last chunk carries no usage")
    early = [c for c in chunks[:-1] if c.get("usage")]
    expect(not early, f"{len(early)} chunks before the last carry usage")
    return "include_usage honoured"


@check("streaming", "SDK reads the stream")
def sdk_stream(t: Target, model: str) -> str:
    # The SDK's typed overloads cannot follow a request built from parts; what it parses can.
    create: Any = t.sdk.chat.completions.create
    stream = create(
        model=model, messages=SAY_OK, max_completion_tokens=ANSWER_TOKENS, stream=True, **t.low_effort(model)
    )
    text, reasoning, finish = "", "", None
    chunk: ChatCompletionChunk
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        reasoning += str((delta.model_extra or {}).get("reasoning_content") or "")
        finish = chunk.choices[0].finish_reason or finish
    expect(finish is not None, "the SDK saw no finish_reason")
    expect(bool(text or reasoning), "the SDK read neither content nor reasoning")
    return f"{len(reasoning)} reasoning + {len(text)} answer characters"
