"""What the prompt cache buys: time to first token with a cached prefix, and a multi-turn chat.

Prints, in one run, through the real server and the official openai SDK, each side as a median
with its spread (min-max) over interleaved rounds, and the ratio of the medians:
- time to first token (TTFT) for a ~2,000-token shared prefix plus a question: each round sends
  a new prefix cold (the baseline), then the same prefix with another question (cached);
  ``cached_tokens`` shows the reuse was real (target for the ratio: <= 0.2);
- a 10-turn conversation (fixed user and assistant turns, so both sides process identical
  prompts): the sum of per-turn TTFT on a server with the cache and on a second server, running
  at the same time, started with ``KIMI_CACHE_ENABLED=false``; the rounds alternate between them.

    python -m benchmarks.prompt_cache [--model smollm2-135m] [--threads 2] [--rounds 5]
    python -m benchmarks.prompt_cache --quick      # small sizes, for a smoke run
"""

from __future__ import annotations

import argparse
import time
import uuid
from contextlib import ExitStack
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

from benchmarks._measure import interleave, machine_note, ratio, spread
from benchmarks._server import KEY, running_server

MODEL = "kimi-k3.1-pro"


def document(words: int) -> str:
    """A long, varied text to serve as the shared prefix (about 1.3 tokens per word)."""
    parts = []
    for i in range(words // 12):
        parts.append(f"Fact {i}: the depot at kilometre {i * 7 % 97} ships {i * 13 % 41} crates on day {i % 7}.")
    return " ".join(parts)


def ttft(client: openai.OpenAI, messages: list[ChatCompletionMessageParam]) -> tuple[float, dict[str, Any]]:
    """Seconds until the first streamed delta, and the request's usage."""
    start = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        reasoning_effort="low",
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


def shared_prefix(client: openai.OpenAI, rounds: int, words: int) -> None:
    """Each round: a new prefix, cold once (A), then cached with another question (B)."""
    state: dict[str, str] = {}

    def cold() -> float:
        state["prefix"] = f"[{uuid.uuid4().hex}] Reference notes follow.\n" + document(words)
        seconds, usage = ttft(client, ask(state["prefix"], "Which depot ships the most crates?"))
        state["cold"] = cached_of(usage)
        return seconds

    def cached() -> float:
        seconds, usage = ttft(client, ask(state["prefix"], "What happens on day 3?"))
        print(f"  round: cold {state['cold']}, then {cached_of(usage)}")
        return seconds

    samples = interleave(rounds, {"cold": cold, "cached": cached})
    print(f"shared prefix TTFT: cold {spread(samples['cold'], ' s')}, cached {spread(samples['cached'], ' s')}")
    print(
        f"shared prefix: cached / cold TTFT (ratio of medians) = {ratio(samples['cached'], samples['cold']):.3f}"
        "  (target <= 0.2)"
    )


def ask(prefix: str, question: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": prefix}, {"role": "user", "content": question}]


def conversation_turns(turns: int) -> list[tuple[str, str]]:
    out = []
    for i in range(turns):
        user = f"Turn {i}: " + document(36).replace("Fact", f"Note{i}")
        assistant = f"Noted turn {i}. " + document(24).replace("Fact", f"Reply{i}")
        out.append((user, assistant))
    return out


def conversation(client: openai.OpenAI, turns: int) -> tuple[float, list[str]]:
    """Sum of TTFT over the turns; each turn sends the whole history plus a new user turn. A new
    tag per call, so nothing is reused from an earlier round."""
    history: list[ChatCompletionMessageParam] = [{"role": "system", "content": f"[{uuid.uuid4().hex}] Be brief."}]
    total = 0.0
    notes = []
    for user, assistant in conversation_turns(turns):
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
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--words", type=int, default=1000, help="shared prefix length (~1.3 tokens a word)")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="a ~400-token prefix, 4 turns, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.words, args.turns = 3, 300, 4
    common = ("--threads", str(args.threads), "--ctx-size", "16384", "--parallel", "2")

    with ExitStack() as stack:
        url = stack.enter_context(running_server(args.model, *common))
        cold_url = stack.enter_context(running_server(args.model, *common, env={"KIMI_CACHE_ENABLED": "false"}))
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=600)
        uncached = openai.OpenAI(base_url=cold_url, api_key=KEY, max_retries=0, timeout=600)
        shared_prefix(client, args.rounds, args.words)
        notes: dict[str, list[str]] = {}

        def run(name: str, c: openai.OpenAI) -> float:
            total, notes[name] = conversation(c, args.turns)
            return total

        samples = interleave(
            args.rounds, {"with": lambda: run("with", client), "without": lambda: run("without", uncached)}
        )
    print(
        f"{args.turns} turns, sum of TTFT: with the cache {spread(samples['with'], ' s')}, "
        f"without {spread(samples['without'], ' s')}"
    )
    print(f"  last round per turn, with: {', '.join(notes['with'])}")
    print(
        f"{args.turns} turns: with / without the cache (ratio of medians) = "
        f"{ratio(samples['with'], samples['without']):.3f}"
    )
    print(f"model {args.model}, {args.threads} threads, {args.rounds} interleaved rounds; {machine_note()}")


if __name__ == "__main__":
    main()
