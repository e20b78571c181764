"""Decode throughput of the embedded engine under concurrency, and its overhead over llama.cpp.

Prints, in one run:
- aggregate decode tokens/s of 1, 4 and 8 concurrent streaming requests through the real server
  and the official openai SDK, each as a ratio to the single-request rate;
- the server's single-request decode tokens/s as a ratio to llama.cpp's own figure
  (``timings.predicted_per_second`` of a direct in-process xllamacpp call, same model, same
  thread count, measured first in this same run).

Every request decodes exactly N tokens: the reasoning floor equals the cap, so end-of-turn is
masked and lengths do not vary with what the model says.

    python benchmarks/concurrency.py [--model smollm2-135m] [--tokens 128] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import openai

from benchmarks._server import KEY, running_server
from kimi_server.models.pull import resolve_model
from kimi_server.models.store import ModelStore, default_models_dir


def llama_cpp_rate(model_path: str, tokens: int, threads: int) -> float:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = model_path
    params.n_ctx = 4096
    params.n_parallel = 1
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.verbosity = -1
    server = xllamacpp.Server(params)
    body = {"prompt": "Write a story about a lighthouse.", "n_predict": tokens, "ignore_eos": True}
    server.handle_completions({**body, "n_predict": 8})  # warm-up
    result = server.handle_completions(body)
    del server
    return float(result["timings"]["predicted_per_second"])


async def stream_once(client: openai.AsyncOpenAI, tokens: int, i: int) -> tuple[int, float, float]:
    """(tokens decoded after the first, time of first token, time of last token)."""
    stream = await client.chat.completions.create(
        model="kimi-k3.1-pro",
        messages=[{"role": "user", "content": f"Write a story about lighthouse number {i}."}],
        reasoning_effort="low",  # type: ignore[arg-type]
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


async def aggregate_rate(base_url: str, tokens: int, concurrency: int) -> float:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=600) as client:
        results = await asyncio.gather(*(stream_once(client, tokens, i) for i in range(concurrency)))
    decoded = sum(r[0] for r in results)
    start = min(r[1] for r in results)
    end = max(r[2] for r in results)
    return decoded / (end - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    path = resolve_model(args.model, ModelStore(default_models_dir()), auto_pull=True)

    baseline = llama_cpp_rate(str(path), args.tokens, args.threads)
    print(f"llama.cpp direct ({args.model}, {args.threads} threads): {baseline:.1f} tok/s")

    n = args.tokens
    budgets = json.dumps({"low": {"floor": n, "cap": n}})
    extra = ("--threads", str(args.threads), "--parallel", "8")
    with running_server(args.model, *extra, env={"KIMI_BUDGETS": budgets}) as url:
        asyncio.run(aggregate_rate(url, 8, 1))  # warm-up
        rates = {c: asyncio.run(aggregate_rate(url, n, c)) for c in (1, 4, 8)}
    single = rates[1]
    for c, rate in rates.items():
        print(f"{c} concurrent: {rate:6.1f} tok/s aggregate  ratio to 1 request: {rate / single:.2f}x")
    print(f"kimi-server single-request decode vs llama.cpp direct: {single / baseline:.2f}x")


if __name__ == "__main__":
    main()
