"""What kimi-server adds when it relays an upstream engine, against a bare pass-through relay.

One run starts three processes on 127.0.0.1: a fast fake upstream (Starlette, answers at once),
a bare relay (a few lines of Starlette + httpx that forward bytes unchanged), and kimi-server
with ``serve --upstream``. It then measures, for each relay:

- added latency: p50 / p99 of sequential non-streaming requests through the relay, minus the
  same percentile calling the upstream directly;
- requests/s at 64 concurrent non-streaming requests;
- SSE events/s relayed at 16 concurrent streams (each upstream stream has --chunks chunks);

and prints kimi-server's figures as ratios to the bare relay's (targets: added p50 <= 1.5x,
requests/s >= 0.7x, events/s >= 0.8x).

    python benchmarks/relay.py [--requests 300] [--streams 48] [--chunks 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from benchmarks._server import KEY, _free_port

BODY = {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1000}


def serve_upstream(port: int, chunks: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    usage = {"prompt_tokens": 5, "completion_tokens": chunks, "total_tokens": 5 + chunks}
    answer = json.dumps({
        "id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }).encode()
    short = [frame({"content": "Hello"}), frame({"content": " there."}), frame({}, "stop")]
    tail = [b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n", b"data: [DONE]\n\n"]
    long = [frame({"content": "tok "}) for _ in range(chunks)] + [frame({}, "stop")]

    async def gen(frames: list[bytes]) -> AsyncIterator[bytes]:
        for f in frames:
            yield f

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            return Response(answer, media_type="application/json")
        # kimi-server always streams from its upstream; a client's non-streaming request is short.
        frames = long if body.get("max_tokens", 0) >= 1000 or body.get("max_completion_tokens", 0) >= 1000 else short
        return StreamingResponse(gen(frames + tail), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def serve_bare(port: int, upstream: str) -> None:
    """The baseline: Starlette + httpx, bytes forwarded as they come."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256, keepalive_expiry=2)
    client = httpx.AsyncClient(limits=limits)

    async def chat(request: Request) -> Response:
        req = client.build_request("POST", f"{upstream}/chat/completions", content=await request.body(),
                                   headers={"content-type": "application/json"})
        resp = await client.send(req, stream=True)
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code,
                                 media_type=resp.headers.get("content-type"), background=BackgroundTask(resp.aclose))

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def start(args: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(args, env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{args} did not start")


async def latencies(client: httpx.AsyncClient, url: str, n: int, body: dict[str, Any]) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await client.post(url, json=body)
        r.raise_for_status()
        out.append(time.perf_counter() - t)
    return out


async def rps(client: httpx.AsyncClient, url: str, total: int, concurrency: int, body: dict[str, Any]) -> float:
    queue = iter(range(total))

    async def worker() -> None:
        for _ in queue:
            (await client.post(url, json=body)).raise_for_status()

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - t)


async def events_per_s(client: httpx.AsyncClient, url: str, streams: int, concurrency: int,
                       body: dict[str, Any]) -> float:
    queue = iter(range(streams))
    count = 0

    async def worker() -> None:
        nonlocal count
        for _ in queue:
            async with client.stream("POST", url, json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        count += 1

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count / (time.perf_counter() - t)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


async def measure(urls: dict[str, str], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Interleaved, so the load other processes put on the machine falls on every target alike:
    latencies request by request in turn; throughput in alternating rounds, the best kept."""
    headers = {"Authorization": f"Bearer {KEY}"}
    # Below uvicorn's 5 s keep-alive, so the client never reuses a connection the server closed.
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128, keepalive_expiry=2)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=120) as client:
        short = {**BODY, "max_tokens": 8}
        for url in urls.values():  # warm-up: connections, imports, first-request paths
            await latencies(client, url, 20, short)
        samples: dict[str, list[float]] = {name: [] for name in urls}
        for _ in range(args.requests):
            for name, url in urls.items():
                samples[name] += await latencies(client, url, 1, short)
        result = {name: {"p50": pct(lat, 50), "p99": pct(lat, 99)} for name, lat in samples.items()}
        relays = [name for name in urls if name != "direct"]
        for name in relays:
            result[name]["rps"] = result[name]["events"] = 0.0
        for _ in range(args.rounds):
            for name in relays:
                rate = await rps(client, urls[name], args.requests, 64, short)
                result[name]["rps"] = max(result[name]["rps"], rate)
            for name in relays:
                rate = await events_per_s(client, urls[name], args.streams, 16, BODY)
                result[name]["events"] = max(result[name]["events"], rate)
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--streams", type=int, default=48)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        return serve_upstream(args.serve_upstream, args.chunks)
    if args.serve_bare:
        return serve_bare(int(args.serve_bare[0]), args.serve_bare[1])

    me = [sys.executable, "-m", "benchmarks.relay", "--chunks", str(args.chunks)]
    up_port, bare_port, kimi_port = _free_port(), _free_port(), _free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    procs = [start([*me, "--serve-upstream", str(up_port)], up_port)]
    try:
        procs.append(start([*me, "--serve-bare", str(bare_port), upstream], bare_port))
        with tempfile.TemporaryDirectory() as tmp:
            kimi = [sys.executable, "-m", "kimi_server.cli", "serve", "--port", str(kimi_port),
                    "--upstream", upstream, "--api-key", KEY]
            procs.append(start(kimi, kimi_port, {"KIMI_DATA_DIR": tmp, "KIMI_LOG_LEVEL": "warning"}))
            urls = {
                "direct": f"{upstream}/chat/completions",
                "bare": f"http://127.0.0.1:{bare_port}/v1/chat/completions",
                "kimi": f"http://127.0.0.1:{kimi_port}/v1/chat/completions",
            }
            r = asyncio.run(measure(urls, args))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    direct, bare, kimi = r["direct"], r["bare"], r["kimi"]
    added = {k: {q: max(r[k][q] - direct[q], 1e-9) for q in ("p50", "p99")} for k in ("bare", "kimi")}
    ms = lambda v: f"{v * 1000:.2f} ms"  # noqa: E731
    print(f"direct upstream latency   p50 {ms(direct['p50'])}  p99 {ms(direct['p99'])}")
    for k in ("bare", "kimi"):
        print(f"{k:5} added latency       p50 {ms(added[k]['p50'])}  p99 {ms(added[k]['p99'])}  "
              f"requests/s(64) {r[k]['rps']:.0f}  events/s(16 streams) {r[k]['events']:.0f}")
    print("kimi-server / bare relay:")
    print(f"  added p50 {added['kimi']['p50'] / added['bare']['p50']:.2f}x (target <= 1.5x)"
          f"  added p99 {added['kimi']['p99'] / added['bare']['p99']:.2f}x")
    print(f"  requests/s {kimi['rps'] / bare['rps']:.2f}x (target >= 0.7x)"
          f"  events/s {kimi['events'] / bare['events']:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
