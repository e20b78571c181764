"""Latency figures per model: time to the first token (reasoning or answer) and tokens per
second after it, from one short streamed answer asked while nothing else of the run is in
flight. Reported, never judged."""

from __future__ import annotations

from kimi_server.verify.outcome import Info, Skipped
from kimi_server.verify.registry import check
from kimi_server.verify.target import Target

TOKENS = 32
# An answer long enough to measure a rate over (a reasoning phase may come first).
COUNT = [{"role": "user", "content": "Count from 1 to 30, one number per line."}]


@check("latency", "TTFT and tokens/s", per_model=True)
def figures(t: Target, model: str) -> None:
    body = {
        "model": model,
        "messages": COUNT,
        "max_completion_tokens": TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        **t.low_effort(model),
    }
    s = t.stream_json("/chat/completions", body)
    firsts = [
        at
        for chunk, at in zip(s.events, s.times, strict=True)
        for ch in chunk.get("choices") or []
        if (ch.get("delta") or {}).get("content") or (ch.get("delta") or {}).get("reasoning_content")
    ]
    if not firsts:
        raise Skipped("the stream carried no tokens")
    ttft = firsts[0] - s.started
    usage = s.events[-1].get("usage") or {}
    tokens = usage.get("completion_tokens") or len(firsts)
    span = s.times[-1] - firsts[0]
    rate = f"{(tokens - 1) / span:.1f} tokens/s" if span > 0 and tokens > 1 else "tokens/s n/a"
    raise Info(f"TTFT {ttft * 1000:.0f} ms, {rate} ({tokens} tokens)")
