"""Decode throughput under concurrency: kimi-server against llama.cpp itself, like with like.

Both sides make the same llama.cpp call (xllamacpp ``handle_completions``, streamed) on the same
model, thread count and slot count (``--parallel``): the baseline calls it directly in this
process, the variant goes through a real kimi-server (HTTP, the official openai SDK, the
reasoning phase). A second baseline streams the same completion from llama.cpp's own HTTP
server (the same in-process llama.cpp with its port open) through the same openai SDK client:
what running llama.cpp's server alone costs a client on the same machine. For 1 and more
concurrent requests, each round runs the baselines and then the variant (A, B, C, A, B, C,
...); each side reports the median aggregate decode rate (tokens after the
first, divided by the time from the first token to the last) and its spread, and the ratio of
the medians. Every request decodes exactly N tokens: the baseline ignores end-of-turn, and on
the server the reasoning floor equals the cap, so end-of-turn is masked there too.

    python -m benchmarks.concurrency [--model smollm2-135m] [--tokens 128] [--rounds 5]
    python -m benchmarks.concurrency --quick      # small sizes, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import openai

from benchmarks._measure import interleave, machine_note, ratio, spread
from benchmarks._server import KEY, _free_port, running_server
from kimi_server.models.pull import resolve_model
from kimi_server.models.store import ModelStore, default_models_dir

SETTLE_S = 1.0
HTTP_KEY = "sk-llamacpp-bench"
# The same user turn both sides see (the server adds its reasoning-phase framing around it).
QUESTION = "Write a story about lighthouse number {i}."


def load_llama(model_path: str, threads: int, slots: int, ctx: int, port: int = 0) -> Any:
    """llama.cpp as the embedded engine loads it for ``--parallel slots``: one more slot (the
    engine's utility slot) and one context shared by all slots. ``port``: also serve llama.cpp's
    own HTTP API there, under ``HTTP_KEY`` (0: no listener)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = model_path
    params.n_ctx = ctx
    params.n_parallel = slots + 1
    params.kv_unified = True
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.warmup = False
    params.verbosity = -1
    params.port = port
    params.api_keys = [HTTP_KEY if port else os.urandom(16).hex()]  # a closed port stays locked
    return xllamacpp.Server(params)


def raw_once(server: Any, tokens: int, i: int, out: list[tuple[int, float, float]]) -> None:
    """One streamed completion; appends (tokens after the first, first time, last time)."""
    times: list[float] = []

    def on_chunk(chunk: Any) -> bool:
        choices = (chunk.get("choices") if isinstance(chunk, dict) else None) or [{}]
        if choices[0].get("text"):
            times.append(time.perf_counter())
        return False

    prompt = f"<|im_start|>user\n{QUESTION.format(i=i)}<|im_end|>\n<|im_start|>assistant\n"
    body = {
        "prompt": prompt,
        "n_predict": tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.7,
        "top_p": 0.95,
        "cache_prompt": False,
    }
    server.handle_completions(body, on_chunk)
    out.append((len(times) - 1, times[0], times[-1]))


async def http_once(client: openai.AsyncOpenAI, tokens: int, i: int) -> tuple[int, float, float]:
    """The raw side's completion through llama.cpp's own HTTP server and the openai SDK."""
    stream = await client.completions.create(
        model="llama.cpp",
        prompt=f"<|im_start|>user\n{QUESTION.format(i=i)}<|im_end|>\n<|im_start|>assistant\n",
        max_tokens=tokens,
        temperature=0.7,
        top_p=0.95,
        stream=True,
        extra_body={"ignore_eos": True, "cache_prompt": False},
    )
    times = [time.perf_counter() async for chunk in stream if chunk.choices and chunk.choices[0].text]
    return len(times) - 1, times[0], times[-1]


def http_rate(base_url: str, tokens: int, concurrency: int) -> float:
    async def go() -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=HTTP_KEY, max_retries=0, timeout=600) as client:
            results = await asyncio.gather(*(http_once(client, tokens, i) for i in range(concurrency)))
        return aggregate(list(results))

    return asyncio.run(go())


def settled(measure: Callable[[], float]) -> float:
    """A pause first: each side starts on a machine the other has left, as a server alone would
    (the server's cpu_poll auto reads the machine every 0.2 s)."""
    time.sleep(SETTLE_S)
    return measure()


def aggregate(results: list[tuple[int, float, float]]) -> float:
    decoded = sum(r[0] for r in results)
    return decoded / (max(r[2] for r in results) - min(r[1] for r in results))


def raw_rate(server: Any, tokens: int, concurrency: int) -> float:
    results: list[tuple[int, float, float]] = []
    threads = [threading.Thread(target=raw_once, args=(server, tokens, i, results)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return aggregate(results)


async def stream_once(client: openai.AsyncOpenAI, tokens: int, i: int) -> tuple[int, float, float]:
    stream = await client.chat.completions.create(
        model="kimi-k3.1-pro",
        messages=[{"role": "user", "content": QUESTION.format(i=i)}],
        reasoning_effort="low",
        max_completion_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    first = last = 0.0
    count = 0
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            count = chunk.usage.completion_tokens
        elif chunk.choices and (chunk.choices[0].delta.model_extra or chunk.choices[0].delta.content):
            first = first or now
            last = now
    return count - 1, first, last


def server_rate(base_url: str, tokens: int, concurrency: int) -> float:
    async def go() -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=600) as client:
            results = await asyncio.gather(*(stream_once(client, tokens, i) for i in range(concurrency)))
        return aggregate(list(results))

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--parallel", type=int, default=8, help="slots, on both sides")
    parser.add_argument("--concurrency", default="1,4,8", help="comma-separated request counts")
    parser.add_argument("--quick", action="store_true", help="32 tokens, 1 and 4 requests, 3 rounds")
    # On a machine shared with other work, llama.cpp's threads wait on each other at every step
    # and 2 threads can decode many times slower than 1: compare with --threads 1 there.
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.rounds, args.concurrency = 32, 3, "1,4"
    levels = [int(c) for c in args.concurrency.split(",")]
    path = str(resolve_model(args.model, ModelStore(default_models_dir()), auto_pull=True))
    ctx = 4096
    port = _free_port()
    raw = load_llama(path, args.threads, args.parallel, ctx, port)
    http_url = f"http://127.0.0.1:{port}/v1"
    # Every level at the same floor and cap: the levels may not overlap, whatever --tokens is.
    budgets = json.dumps({level: {"floor": args.tokens, "cap": args.tokens} for level in ("low", "high", "max")})
    extra = ("--threads", str(args.threads), "--parallel", str(args.parallel), "--ctx-size", str(ctx))
    with running_server(args.model, *extra, env={"KIMI_BUDGETS": budgets}) as url:
        raw_rate(raw, 8, 1)  # warm-up, every side
        http_rate(http_url, 8, 1)
        server_rate(url, 8, 1)
        sides: dict[str, Any] = {}
        for c in levels:
            sides[f"llama.cpp x{c}"] = lambda c=c: settled(lambda: raw_rate(raw, args.tokens, c))
            sides[f"llama.cpp http x{c}"] = lambda c=c: settled(lambda: http_rate(http_url, args.tokens, c))
            sides[f"kimi-server x{c}"] = lambda c=c: settled(lambda: server_rate(url, args.tokens, c))
        samples = interleave(args.rounds, sides)
    print(
        f"model {args.model}, {args.tokens} tokens per request, {args.threads} threads, {args.parallel} slots "
        f"on both sides, {args.rounds} interleaved rounds; {machine_note()}"
    )
    print("aggregate decode tok/s, median [min-max]:")
    for c in levels:
        base, mine = samples[f"llama.cpp x{c}"], samples[f"kimi-server x{c}"]
        print(
            f"  {c} concurrent: llama.cpp {spread(base)}  kimi-server {spread(mine)}  "
            f"kimi-server / llama.cpp = {ratio(mine, base):.2f}x"
        )
    print("the same through llama.cpp's own HTTP server and the same openai SDK client:")
    for c in levels:
        http, mine = samples[f"llama.cpp http x{c}"], samples[f"kimi-server x{c}"]
        print(
            f"  {c} concurrent: llama.cpp's HTTP server {spread(http)}  "
            f"kimi-server / llama.cpp http = {ratio(mine, http):.2f}x"
        )
    lo = levels[0]
    for c in levels[1:]:
        mine_x = ratio(samples[f"kimi-server x{c}"], samples[f"kimi-server x{lo}"])
        base_x = ratio(samples[f"llama.cpp x{c}"], samples[f"llama.cpp x{lo}"])
        print(f"  {c} concurrent / {lo}: kimi-server {mine_x:.2f}x, llama.cpp {base_x:.2f}x")


if __name__ == "__main__":
    main()
