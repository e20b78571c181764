"""What the prompt cache buys: time to first token with a cached prefix, and a 10-turn chat.

Prints, in one run, through the real server and the official openai SDK:
- time to first token (TTFT) for a ~2,000-token shared prefix plus a new question: cold (first
  request) and cached (same prefix, other questions), and cached / cold as a ratio (target
  <= 0.2); ``cached_tokens`` shows the reuse was real;
- a 10-turn conversation (fixed user and assistant turns, so both runs process identical
  prompts): the sum of per-turn TTFT (prompt processing, as a client sees it) with the cache
  and on a second server started with ``KIMI_CACHE_ENABLED=false``, and their ratio.

    python benchmarks/prompt_cache.py [--model smollm2-135m] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import openai

from benchmarks._server import KEY, running_server

MODEL = "kimi-k3.1-pro"


def document(words: int) -> str:
    """A long, varied text to serve as the shared prefix (about 1.3 tokens per word)."""
    parts = []
    for i in range(words // 12):
        parts.append(f"Fact {i}: the depot at kilometre {i * 7 % 97} ships {i * 13 % 41} crates on day {i % 7}.")
    return " ".join(parts)


def ttft(client: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    """Seconds until the first streamed delta, and the request's usage."""
    start = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        reasoning_effort="low",  # type: ignore[arg-type]
        max_completion_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if first is None and chunk.choices:
            delta = chunk.choices[0].delta
            if delta.content or (delta.model_extra or {}).get("reasoning_content"):
                first = time.perf_counter() - start
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    assert first is not None, "no token arrived"
    return first, usage


def cached_of(usage: dict[str, Any]) -> str:
    details = usage.get("prompt_tokens_details") or {}
    return f"{details.get('cached_tokens')}/{usage.get('prompt_tokens')} cached"


def shared_prefix(client: openai.OpenAI, rounds: int = 2) -> None:
    """Each round: a new ~2,000-token prefix, cold once, then cached with other questions.

    Cold and cached runs of a round are measured back to back, so load from other processes
    on the machine hits both alike.
    """
    colds: list[float] = []
    warms: list[float] = []
    for _ in range(rounds):
        prefix = f"[{uuid.uuid4().hex}] Reference notes follow.\n" + document(1000)

        def ask(question: str, prefix: str = prefix) -> list[dict[str, Any]]:
            return [{"role": "system", "content": prefix}, {"role": "user", "content": question}]

        cold, usage = ttft(client, ask("Which depot ships the most crates?"))
        colds.append(cold)
        print(f"shared prefix: cold TTFT {cold:.2f} s ({cached_of(usage)})")
        for question in ("How many facts are there?", "What happens on day 3?"):
            seconds, usage = ttft(client, ask(question))
            warms.append(seconds)
            print(f"shared prefix: cached TTFT {seconds:.2f} s ({cached_of(usage)})")
    ratio = statistics.median(warms) / statistics.median(colds)
    print(f"shared prefix: cached / cold TTFT (medians) = {ratio:.3f}  (target <= 0.2)")


def conversation_turns() -> list[tuple[str, str]]:
    turns = []
    for i in range(10):
        user = f"Turn {i}: " + document(36).replace("Fact", f"Note{i}")
        assistant = f"Noted turn {i}. " + document(24).replace("Fact", f"Reply{i}")
        turns.append((user, assistant))
    return turns


def ten_turns(client: openai.OpenAI, tag: str) -> tuple[float, list[str]]:
    """Sum of TTFT over 10 turns; each turn sends the whole history plus a new user turn."""
    history: list[dict[str, Any]] = [{"role": "system", "content": f"[{tag}] Be brief."}]
    total = 0.0
    notes = []
    for user, assistant in conversation_turns():
        history.append({"role": "user", "content": user})
        seconds, usage = ttft(client, history)
        total += seconds
        notes.append(cached_of(usage))
        history.append({"role": "assistant", "content": assistant})
    return total, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    common = ("--threads", str(args.threads), "--ctx-size", "16384", "--parallel", "2")
    tag = uuid.uuid4().hex

    with running_server(args.model, *common) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=600)
        shared_prefix(client)
        with_cache, notes = ten_turns(client, tag)
        print(f"10 turns with the cache: {with_cache:.2f} s of TTFT; per turn: {', '.join(notes)}")

    with running_server(args.model, *common, env={"KIMI_CACHE_ENABLED": "false"}) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=600)
        without, notes = ten_turns(client, tag)
        print(f"10 turns without the cache: {without:.2f} s of TTFT; per turn: {', '.join(notes)}")

    print(f"10 turns: with / without the cache = {with_cache / without:.3f}")


if __name__ == "__main__":
    main()
