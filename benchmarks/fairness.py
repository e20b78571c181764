"""Fairness under a flood: one key keeps 32 requests in flight, another sends one at a time.

Prints the quiet key's median latency with the flood running, as a ratio to its median latency
on the idle server, both measured in this same run and interleaved (idle, flood, idle, flood…,
``--rounds`` of each), with the spread over rounds. Target: at most 3x. Without the fair queue
the quiet key's request waits behind the whole flood (about 32 / slots requests' time).

    python benchmarks/fairness.py [--model smollm2-135m] [--parallel 4] [--rounds 3] [--samples 5]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=24, help="max_completion_tokens per request")
    args = parser.parse_args()
    extra = ["--api-key", QUIET, "--parallel", str(args.parallel), "--ctx-size", "4096"]
    with running_server(args.model, *extra, env=ENV) as base:
        asyncio.run(measure(base, args.rounds, args.samples, args.tokens))


if __name__ == "__main__":
    main()
