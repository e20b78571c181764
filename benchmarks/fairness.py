"""Fairness under a flood: one key keeps 32 requests in flight, another sends one at a time.

Prints the quiet key's median latency with the flood running, as a ratio to its median latency
on the idle server, both measured in this same run and interleaved (idle, flood, idle, flood…,
``--rounds`` of each), with the spread over rounds. Target: at most 3x. Without the fair queue
the quiet key's request waits behind the whole flood (about 32 / slots requests' time).

    python benchmarks/fairness.py [--model smollm2-135m] [--parallel 4] [--rounds 3] [--samples 5]

``--prefill``: one key sends a long multi-line prompt (about 6,000 tokens, one per character)
while the quiet key streams; prints the quiet key's time per streamed token (from sending its
request to its last token, so a prompt left waiting counts) with that prefill running, as a
ratio to the same on the idle server, interleaved over ``--rounds``. Target: at
most 3x. ``--prefill-turn`` / ``--prefill-turn-shared`` set the server's (to compare choices;
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


async def long_prompt_running(client: httpx.AsyncClient, base: str) -> None:
    """Until the long prompt's llama.cpp call is in flight (the sender's own engine stats)."""
    for _ in range(600):
        r = await client.get(f"{base}/engine/stats", headers={"Authorization": f"Bearer {KEY}"})
        if r.json()["data"][0]["active_calls"] > 0:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the long prompt never reached the engine")


async def measure_prefill(base: str, rounds: int, tokens: int) -> None:
    url = f"{base}/chat/completions"
    ratios: list[float] = []
    async with httpx.AsyncClient(timeout=1200) as client:
        await streamed_gaps(client, url, tokens, "warm-up")
        for n in range(rounds):
            idle, idle_first = await streamed_gaps(client, url, tokens, f"idle {n}")
            # A new first line each round: the sender's prompt cache must not serve it.
            long_body = {**body(n, 4), "messages": [{"role": "user", "content": f"round {n}\n" + LONG_PROMPT}]}
            sender = asyncio.create_task(client.post(url, json=long_body, headers={"Authorization": f"Bearer {KEY}"}))
            await long_prompt_running(client, base)
            busy, busy_first = await streamed_gaps(client, url, tokens, f"busy {n}")
            still_reading = not sender.done()
            sender.cancel()  # the server stops the departed request's slot
            await asyncio.gather(sender, return_exceptions=True)
            await asyncio.sleep(1.0)
            ratios.append(busy / idle)
            print(
                f"round {n + 1}: quiet key time per token idle {idle * 1000:.0f} ms, beside the long "
                f"prompt {busy * 1000:.0f} ms, ratio {busy / idle:.2f}x (first token {idle_first:.2f} s "
                f"-> {busy_first:.2f} s)" + ("" if still_reading else "; the long request ended first"),
                flush=True,
            )
        # What the small batches and turns cost a long prompt read alone.
        start = time.perf_counter()
        alone = {**body(rounds, 4), "messages": [{"role": "user", "content": "alone\n" + LONG_PROMPT}]}
        r = await client.post(url, json=alone, headers={"Authorization": f"Bearer {KEY}"})
        r.raise_for_status()
        read = r.json()["usage"]["prompt_tokens"]
        print(f"the long prompt alone: {read} tokens answered in {time.perf_counter() - start:.1f} s")
    print(
        f"quiet key time per token beside a {len(LONG_PROMPT)}-character multi-line prompt / idle: "
        f"median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x over "
        f"{rounds} rounds; target <= 3x)"
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
    args = parser.parse_args()
    if args.prefill:
        env = {**ENV, "KIMI_BUDGETS": '{"low": {"floor": 8, "cap": 16}}'}
        if args.prefill_turn is not None:
            env["KIMI_PREFILL_TURN"] = str(args.prefill_turn)
        if args.prefill_turn_shared is not None:
            env["KIMI_PREFILL_TURN_SHARED"] = str(args.prefill_turn_shared)
        extra = ["--api-key", QUIET, "--parallel", str(args.parallel), "--ctx-size", "8192"]
        with running_server(args.model, *extra, env=env) as base:
            asyncio.run(measure_prefill(base, args.rounds, max(args.tokens, 32)))
        return
    extra = ["--api-key", QUIET, "--parallel", str(args.parallel), "--ctx-size", "4096"]
    with running_server(args.model, *extra, env=ENV) as base:
        asyncio.run(measure(base, args.rounds, args.samples, args.tokens))


if __name__ == "__main__":
    main()
