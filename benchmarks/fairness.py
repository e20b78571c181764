"""Fairness under a flood: one key keeps 32 requests in flight, another sends one at a time.

Prints the quiet key's median latency with the flood running, as a ratio to its median latency
on the idle server, both measured in this same run and interleaved (idle, flood, idle, flood…,
``--rounds`` of each), with the spread over rounds. Target: at most 3x. Without the fair queue
the quiet key's request waits behind the whole flood (about 32 / slots requests' time).

    python benchmarks/fairness.py [--model smollm2-135m] [--parallel 4] [--rounds 3] [--samples 5]

``--prefill``: one key sends a long multi-line prompt (about 6,000 tokens, one per character)
while the quiet key streams request after request; prints both sides: the quiet key's time per
streamed token (from sending its request to its last token, so a prompt left waiting counts) as
a ratio to the same on the idle server, interleaved over ``--rounds`` (target: at most 3x), and
the long prompt's time to its first token beside that stream as a ratio to the same prompt read
alone (bounded by ``prefill_slowdown``, 3x by default). ``--prefill-turn``,
``--prefill-turn-shared`` and ``--prefill-slowdown`` set the server's (to compare choices;
2048 and 0 give llama.cpp's own behaviour, where the quiet key gets one token per 2,048-token
batch, or none until the long prompt is read when its slot comes later).

    python benchmarks/fairness.py --prefill [--model qwen2.5-coder-0.5b] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from benchmarks._server import KEY, running_server

QUIET = "sk-bench-quiet"
FLOOD = 32
BUDGETS = '{"low": {"floor": 8, "cap": 16}}'
# Waiting is what is measured here, so the queue's own time limit must not cut it short.
ENV = {"KIMI_BUDGETS": BUDGETS, "KIMI_QUEUE_MAX_WAIT": "3600"}


def body(i: int, tokens: int) -> dict[str, object]:
    return {
        "model": "kimi-k3.1-pro",
        "messages": [{"role": "user", "content": f"Name a colour ({i})."}],
        "reasoning_effort": "low",
        "max_completion_tokens": tokens,
    }


async def quiet_latencies(client: httpx.AsyncClient, url: str, samples: int, tokens: int) -> list[float]:
    out = []
    for i in range(samples):
        start = time.perf_counter()
        r = await client.post(url, json=body(i, tokens), headers={"Authorization": f"Bearer {QUIET}"})
        r.raise_for_status()
        out.append(time.perf_counter() - start)
    return out


async def flooder(client: httpx.AsyncClient, url: str, tokens: int, counts: dict[int, int]) -> None:
    i = 0
    while True:
        try:
            r = await client.post(url, json=body(i, tokens), headers={"Authorization": f"Bearer {KEY}"})
            status = r.status_code
        except httpx.HTTPError:
            status = 0  # no answer at all
        counts[status] = counts.get(status, 0) + 1
        i += 1


async def measure(base: str, rounds: int, samples: int, tokens: int) -> None:
    url = f"{base}/chat/completions"
    limits = httpx.Limits(max_connections=FLOOD + 8)
    ratios: list[float] = []
    idle_all: list[float] = []
    flood_all: list[float] = []
    counts: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await quiet_latencies(client, url, 1, tokens)  # warm-up
        for n in range(rounds):
            idle = await quiet_latencies(client, url, samples, tokens)
            flood = [asyncio.create_task(flooder(client, url, tokens, counts)) for _ in range(FLOOD)]
            await asyncio.sleep(2.0)  # let the flood fill every slot and the queue
            loaded = await quiet_latencies(client, url, samples, tokens)
            for task in flood:
                task.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
            await asyncio.sleep(1.0)  # the server drops the departed flood
            ratio = statistics.median(loaded) / statistics.median(idle)
            ratios.append(ratio)
            idle_all += idle
            flood_all += loaded
            line = (
                f"round {n + 1}: quiet key p50 idle {statistics.median(idle):.2f} s, "
                f"under flood {statistics.median(loaded):.2f} s, ratio {ratio:.2f}x"
            )
            print(line, flush=True)
    print(f"flood answers by status: {dict(sorted(counts.items()))}")
    print(
        f"quiet key p50 latency under a {FLOOD}-request flood / idle: median {statistics.median(ratios):.2f}x "
        f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x over {rounds} rounds; target <= 3x)"
    )
    print(f"p50 over all samples: idle {statistics.median(idle_all):.2f} s, flood {statistics.median(flood_all):.2f} s")


LONG_PROMPT = "a\nb\nc\n" * 1000  # one token per character on byte-level BPE models


async def streamed_gaps(client: httpx.AsyncClient, url: str, tokens: int, tag: str) -> tuple[float, float]:
    """The quiet key's time per streamed token, from sending the request to its last token (so
    a prompt left waiting behind another counts), and its time to the first token."""
    payload = {**body(0, tokens), "stream": True}
    payload["messages"] = [{"role": "user", "content": f"Tell a long story about a cat ({tag})."}]
    stamps: list[float] = []
    headers = {"Authorization": f"Bearer {QUIET}"}
    start = time.perf_counter()
    async with client.stream("POST", url, json=payload, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and ('"content"' in line or '"reasoning_content"' in line):
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise RuntimeError(f"the quiet stream gave only {len(stamps)} tokens")
    return (stamps[-1] - start) / len(stamps), stamps[0] - start


async def first_token(client: httpx.AsyncClient, url: str, payload: dict[str, object]) -> float:
    """Seconds from sending a streamed request to its first reasoning or content token."""
    start = time.perf_counter()
    async with client.stream(
        "POST", url, json={**payload, "stream": True}, headers={"Authorization": f"Bearer {KEY}"}
    ) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and ('"content"' in line or '"reasoning_content"' in line):
                return time.perf_counter() - start
    raise RuntimeError("the long prompt's stream ended without a token")


def long_body(tag: str) -> dict[str, object]:
    # A new first line each time: the prompt cache must not serve it.
    return {**body(0, 4), "messages": [{"role": "user", "content": f"{tag}\n" + LONG_PROMPT}]}


async def measure_prefill(base: str, rounds: int, tokens: int) -> None:
    """Both sides, each round: the quiet key streams back to back while the long prompt is read
    (its time per token against the idle server's), and the long prompt's time to its first
    token with that stream running (against the same prompt read alone, measured last)."""
    url = f"{base}/chat/completions"
    ratios: list[float] = []
    firsts: list[float] = []
    async with httpx.AsyncClient(timeout=1800) as client:
        await streamed_gaps(client, url, tokens, "warm-up")
        for n in range(rounds):
            idle, _ = await streamed_gaps(client, url, tokens, f"idle {n}")
            sender = asyncio.create_task(first_token(client, url, long_body(f"round {n}")))
            busy: list[float] = []
            while not sender.done():
                gap, _ = await streamed_gaps(client, url, tokens, f"busy {n}.{len(busy)}")
                busy.append(gap)
            long_first = await sender
            firsts.append(long_first)
            ratio = statistics.median(busy) / idle
            ratios.append(ratio)
            print(
                f"round {n + 1}: quiet key time per token idle {idle * 1000:.0f} ms, beside the long prompt "
                f"{statistics.median(busy) * 1000:.0f} ms (median of {len(busy)} streams), ratio {ratio:.2f}x; "
                f"the long prompt's first token after {long_first:.1f} s",
                flush=True,
            )
            await asyncio.sleep(1.0)
        alone = await first_token(client, url, long_body("alone"))
        print(f"the long prompt alone: first token after {alone:.1f} s", flush=True)
    print(
        f"quiet key time per token beside a {len(LONG_PROMPT)}-character multi-line prompt / idle: "
        f"median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x over "
        f"{rounds} rounds; target <= 3x)"
    )
    print(
        f"the long prompt's first token beside a streaming key / alone: median "
        f"{statistics.median(firsts) / alone:.2f}x ({statistics.median(firsts):.1f} s / {alone:.1f} s; "
        f"bounded by prefill_slowdown, 3x by default)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=24, help="max_completion_tokens per request")
    parser.add_argument("--prefill", action="store_true", help="the long-prompt case instead of the flood")
    parser.add_argument("--prefill-turn", type=int, help="the server's prefill_turn (default: its own)")
    parser.add_argument("--prefill-turn-shared", type=int, help="the server's prefill_turn_shared")
    parser.add_argument("--prefill-slowdown", type=float, help="the server's prefill_slowdown")
    args = parser.parse_args()
    if args.prefill:
        env = {**ENV, "KIMI_BUDGETS": '{"low": {"floor": 8, "cap": 16}}'}
        if args.prefill_turn is not None:
            env["KIMI_PREFILL_TURN"] = str(args.prefill_turn)
        if args.prefill_turn_shared is not None:
            env["KIMI_PREFILL_TURN_SHARED"] = str(args.prefill_turn_shared)
        if args.prefill_slowdown is not None:
            env["KIMI_PREFILL_SLOWDOWN"] = str(args.prefill_slowdown)
        extra = ["--api-key", QUIET, "--parallel", str(args.parallel), "--ctx-size", "8192"]
        with running_server(args.model, *extra, env=env) as base:
            asyncio.run(measure_prefill(base, args.rounds, max(args.tokens, 32)))
        return
    extra = ["--api-key", QUIET, "--parallel", str(args.parallel), "--ctx-size", "4096"]
    with running_server(args.model, *extra, env=ENV) as base:
        asyncio.run(measure(base, args.rounds, args.samples, args.tokens))


if __name__ == "__main__":
    main()
