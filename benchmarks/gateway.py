"""What the gateway (stored keys, limits, budget, ledger, metrics) costs per request.

Against the scripted engine (no model: only the server's own work is measured), in one run:
the same server with the gateway off (static key, no ledger) and on (a stored key with RPM,
TPM and a budget, prices, the ledger) on SQLite, and on PostgreSQL + Redis where they are
reachable. For each: p50 and p99 latency of one request at a time, then p50, p99 and
requests/s at 64 concurrent requests; printed with the ratio to "off".
Targets: added p50 <= 1 ms on SQLite, throughput >= 0.8x of off.

    python benchmarks/gateway.py [--requests 2000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from benchmarks._server import KEY, running_server

BODY = {"model": "kimi-k3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
ENGINE = {
    "KIMI_TEST_ENGINE": "scripted",
    "KIMI_TEST_ENGINE_TOKENS": "4",
    "KIMI_LOG_LEVEL": "warning",
    "KIMI_PRICES": '{"kimi-k3": {"input": "0.6", "output": "2.5"}}',
    # One key sends every request: its share of the queue must hold them all, on both sides.
    "KIMI_QUEUE_MAX": "4096",
    "KIMI_QUEUE_MAX_PER_KEY": "4096",
}


def reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


async def measure(base: str, key: str, total: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    errors: list[int] = []
    queue = iter(range(total))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, limits=limits, timeout=60
    ) as c:

        async def worker() -> None:
            for _ in queue:
                t = time.perf_counter()
                try:
                    r = await c.post("/chat/completions", json=BODY)
                except httpx.HTTPError:
                    errors.append(1)
                    continue
                latencies.append(time.perf_counter() - t)
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text[:200]}")

        for _ in range(min(50, total)):  # warm-up
            await c.post("/chat/completions", json=BODY)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "rps": len(latencies) / elapsed,
        "errors": len(errors),
    }


def run_mode(name: str, env: dict[str, str], requests: int, concurrency: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**ENGINE, **env, "KIMI_DATA_DIR": tmp}
        key = KEY
        if env.get("KIMI_GATEWAY_ENABLED") != "false":
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kimi_server.cli",
                    "keys",
                    "create",
                    "--name",
                    "bench",
                    "--rpm",
                    "10000000",
                    "--tpm",
                    "1000000000",
                    "--budget",
                    "1000000",
                    "--allow-unpriced-budget",
                ],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                check=True,
            )
            key = done.stdout.strip().splitlines()[-1]
        with running_server("smollm2-135m", env=env) as base:
            single = asyncio.run(measure(base, key, max(200, requests // 10), 1))
            loaded = asyncio.run(measure(base, key, requests, concurrency))
    print(f"  {name}: measured", file=sys.stderr)
    return {"single": single, "loaded": loaded}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    modes: list[tuple[str, dict[str, str]]] = [
        ("off", {"KIMI_GATEWAY_ENABLED": "false"}),
        ("on, SQLite", {}),
        ("on, SQLite sync=normal", {"KIMI_SQLITE_SYNCHRONOUS": "normal"}),
    ]
    pg, redis = reachable(5432), reachable(6379)
    db_name = "kimi_bench_" + secrets.token_hex(4)
    if pg and redis:
        modes.append(
            (
                "on, PostgreSQL + Redis",
                {
                    "KIMI_DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{db_name}",
                    "KIMI_REDIS_URL": "redis://127.0.0.1:6379/0",
                    "KIMI_REDIS_PREFIX": f"bench-{db_name}:",
                },
            )
        )
        _pg_admin(f"CREATE DATABASE {db_name}")
    results: dict[str, Any] = {}
    try:
        for name, env in modes:
            results[name] = run_mode(name, env, args.requests, args.concurrency)
    finally:
        if pg and redis:
            _pg_admin(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")
    off = results["off"]
    print(f"gateway overhead, scripted engine, {args.requests} requests at {args.concurrency} concurrent")
    print(f"{'mode':26} {'1x p50 ms':>10} {'added':>8} {'64x p50':>9} {'64x p99':>9} {'req/s':>8} {'x off':>6}")
    for name, r in results.items():
        s, lo = r["single"], r["loaded"]
        added = s["p50_ms"] - off["single"]["p50_ms"]
        ratio = lo["rps"] / off["loaded"]["rps"]
        print(
            f"{name:26} {s['p50_ms']:10.2f} {added:8.2f} {lo['p50_ms']:9.1f} {lo['p99_ms']:9.1f} "
            f"{lo['rps']:8.0f} {ratio:6.2f}" + (f"  ({lo['errors']:.0f} connection errors)" if lo["errors"] else "")
        )
    if not (pg and redis):
        print("(PostgreSQL or Redis not reachable: that mode was not measured)")


def _pg_admin(sql: str) -> None:
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


if __name__ == "__main__":
    main()
