"""What kimi-server costs when it relays an upstream engine, against the best bare relays.

One run starts, on 127.0.0.1, a fast fake upstream (raw asyncio: it answers at once and costs
almost nothing) and the relays under test, each pinned to the same core (the last one) while
the upstream and this load generator share the others:

- ``bare16``: a few lines of Starlette + httpx forwarding bytes unchanged, its upstream
  connections spread over 16 ``httpx.AsyncClient`` s (one pool's CPU cost per request grows
  with the connections it holds, so this is the fastest Starlette + httpx relay);
- ``bare``: the same with one pool of 256 connections;
- ``bare wire``: no framework at all, an ASGI function on uvicorn's httptools protocol
  forwarding bytes through the lean upstream client kimi-server itself uses: the floor;
- ``kimi static``: ``kimi-server serve --upstream`` with a static key (ledger on);
- ``kimi stored``: the same with a stored key with RPM, TPM and a budget (limits + ledger);
- ``litellm``: LiteLLM's proxy, only where it is installed (``--litellm``).

Measured, interleaved round by round so load from elsewhere falls on every relay alike:
added latency p50 / p99 (sequential requests, minus calling the upstream directly); requests/s
at 32 and 64 concurrent non-streaming requests; SSE events/s at 16 concurrent streams; and the
relay's own CPU time per request and per event (from /proc, its whole process tree). The load
generator is a raw keep-alive HTTP/1.1 client, one connection per worker, so it is never what
limits a relay. ``--workers`` adds a scaling run: kimi-server with ``--workers 1, 2, N`` on
N cores at 64 concurrent, with nginx as the upstream and wrk as the load where both are
installed (``benchmarks/c_peers.py``), so that the peers leave the cores to the relay.

    python benchmarks/relay.py [--quick] [--rounds 3] [--requests 2000] [--workers] [--litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks import c_peers
from benchmarks._measure import machine_note
from benchmarks._server import KEY, _free_port
from benchmarks.relay_load import BODY, Conn, events, pin, rps, rss_mb, sequential, start, tree_cpu
from benchmarks.relay_peers import serve_bare, serve_bare_wire, serve_upstream, short_sse


@dataclass
class Relay:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    key: str = KEY
    path: str = "/v1/chat/completions"
    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, measure: str, value: float) -> None:
        self.samples.setdefault(measure, []).append(value)

    def median(self, measure: str) -> float:
        return statistics.median(self.samples[measure]) if self.samples.get(measure) else float("nan")


def stored_key(env: dict[str, str]) -> str:
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
            "--models",
            str(BODY["model"]),
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    key: str = done.stdout.strip().splitlines()[-1]
    return key


KIMI_ENV = {"KIMI_LOG_LEVEL": "warning", "KIMI_PRICES": '{"kimi-k3.1-pro": {"input": "0.6", "output": "2.5"}}'}


def start_kimi(
    tmp: str, name: str, upstream: str, cores: set[int] | None, workers: int = 1, stored: bool = False
) -> Relay:
    port = _free_port()
    data = os.path.join(tmp, name.replace(" ", "-"))
    env = {**KIMI_ENV, "KIMI_DATA_DIR": data}
    key = stored_key(env) if stored else KEY
    cmd = [
        sys.executable,
        "-m",
        "kimi_server.cli",
        "serve",
        "--port",
        str(port),
        "--upstream",
        upstream,
        "--api-key",
        KEY,
        "--workers",
        str(workers),
    ]
    return Relay(name, port, start(cmd, port, cores, env, health="/health"), key=key)


def start_litellm(upstream: str, cores: set[int] | None) -> Relay:
    port = _free_port()
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENAI_API_KEY": "sk-none"}
    # Its proxy with one --model sends every request to that model, whatever the model it names.
    script = os.path.join(os.path.dirname(sys.executable), "litellm")
    launcher = [script] if os.path.exists(script) else [sys.executable, "-m", "litellm.proxy.proxy_cli"]
    cmd = [*launcher, "--model", "openai/m", "--api_base", upstream, "--port", str(port)]
    return Relay("litellm", port, start(cmd, port, cores, env, health="/health/liveliness"))


# -- the run ---------------------------------------------------------------------------------------


async def measure_round(relays: list[Relay], direct: Conn, args: argparse.Namespace) -> None:
    body = json.dumps(BODY).encode()
    conns = {r.name: Conn(r.port, r.path, r.key) for r in relays}
    for _ in range(args.sequential):
        direct_t = await sequential(direct, body)
        for r in relays:
            r.add("added", await sequential(conns[r.name], body) - direct_t)
    for c in conns.values():
        c.close()
    for concurrency in (32, 64):
        for r in relays:
            before = tree_cpu(r.proc.pid)
            r.add(f"rps{concurrency}", await rps(r.port, r.path, r.key, args.requests, concurrency))
            r.add(f"cpu{concurrency}", (tree_cpu(r.proc.pid) - before) / (args.requests + concurrency))
    for r in relays:
        before = tree_cpu(r.proc.pid)
        rate, count = await events(r.port, r.path, r.key, args.streams, 16)
        r.add("events", rate)
        r.add("cpu_event", (tree_cpu(r.proc.pid) - before) / max(count, 1))


def report(relays: list[Relay], direct_note: str) -> None:
    def row(label: str, fmt: Callable[[Relay], str]) -> None:
        print(f"| {label} | " + " | ".join(fmt(r) for r in relays) + " |")

    print(f"\n{direct_note}\n")
    print("| measure | " + " | ".join(r.name for r in relays) + " |")
    print("|---" * (len(relays) + 1) + "|")
    row("requests/s, 32 concurrent", lambda r: f"{r.median('rps32'):,.0f}")
    row("requests/s, 64 concurrent", lambda r: f"{r.median('rps64'):,.0f}")
    row("64 vs 32 concurrent", lambda r: f"{r.median('rps64') / r.median('rps32'):.2f}x")
    row("relay CPU per request, 64 concurrent", lambda r: f"{r.median('cpu64') * 1000:.2f} ms")
    row("added latency p50 (sequential)", lambda r: f"{r.median('added') * 1000:.2f} ms")
    row(
        "added latency p99 (sequential)",
        lambda r: f"{statistics.quantiles(r.samples['added'], n=100)[98] * 1000:.2f} ms",
    )
    row("SSE events/s, 16 streams", lambda r: f"{r.median('events'):,.0f}")
    row("relay CPU per SSE event", lambda r: f"{r.median('cpu_event') * 1e6:.0f} µs")
    row("RSS", lambda r: f"{rss_mb(r.proc.pid):.0f} MB")


def verdict(relays: list[Relay]) -> None:
    by = {r.name: r for r in relays}
    kimi, bare16, floor = by["kimi stored"], by["bare16"], by["bare wire"]
    # The absolute targets were set where bare16 cost 0.74 ms of CPU a request and
    # added 1.30 ms: as ratios to bare16 (2.0x, 1.15x) they carry over to a machine of another
    # speed; the absolute figures are printed too.
    checks = [
        ("requests/s at 64 vs bare16", kimi.median("rps64") / bare16.median("rps64"), ">=", 0.5, "x"),
        ("CPU per request vs bare16", kimi.median("cpu64") / bare16.median("cpu64"), "<=", 2.0, "x"),
        ("CPU per request at 64 (absolute)", kimi.median("cpu64") * 1000, "<=", 1.5, " ms"),
        ("SSE events/s vs bare16", kimi.median("events") / bare16.median("events"), ">=", 0.8, "x"),
        ("added latency p50 vs bare16", kimi.median("added") / bare16.median("added"), "<=", 1.15, "x"),
        ("added latency p50 (absolute)", kimi.median("added") * 1000, "<=", 1.5, " ms"),
        ("requests/s 64 vs 32 concurrent", kimi.median("rps64") / kimi.median("rps32"), ">=", 0.9, "x"),
        # What requests/s becomes once each relay has its core to itself (a quiet machine):
        # the ratio of CPU per request, which other load on the machine barely moves.
        ("requests per CPU-second vs bare16", bare16.median("cpu64") / kimi.median("cpu64"), ">=", 0.5, "x"),
        ("SSE events per CPU-second vs bare16", bare16.median("cpu_event") / kimi.median("cpu_event"), ">=", 0.8, "x"),
    ]
    print("\nkimi-server (stored key, limits, ledger) against the targets (baseline: bare16):")
    for label, value, op, target, unit in checks:
        ok = value >= target if op == ">=" else value <= target
        print(f"  {label:36} {value:8.2f}{unit:3}  target {op} {target}{unit}  {'ok' if ok else 'MISSED'}")
    # The floor forwards bytes and checks nothing: what kimi-server's contract, gateway and
    # ledger cost on top of the same parts.
    print("\nkimi-server against the floor (bare wire), no target:")
    print(f"  requests per CPU-second   {floor.median('cpu64') / kimi.median('cpu64'):.2f}x")
    print(f"  SSE events per CPU-second {floor.median('cpu_event') / kimi.median('cpu_event'):.2f}x")
    print(f"  added latency p50         {kimi.median('added') / floor.median('added'):.2f}x the floor's")


def run_relays(args: argparse.Namespace, upstream: str, up_port: int, relay_cores: set[int] | None) -> None:
    me = [sys.executable, "-m", "benchmarks.relay"]
    relays: list[Relay] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, clients in (("bare16", 16), ("bare", 1)):
                port = _free_port()
                proc = start([*me, "--serve-bare", str(port), upstream, str(clients)], port, relay_cores)
                relays.append(Relay(name, port, proc))
            port = _free_port()
            proc = start([*me, "--serve-bare-wire", str(port), upstream, "1"], port, relay_cores)
            relays.append(Relay("bare wire", port, proc))
            relays.append(start_kimi(tmp, "kimi static", upstream, relay_cores))
            relays.append(start_kimi(tmp, "kimi stored", upstream, relay_cores, stored=True))
            if args.litellm:
                if importlib.util.find_spec("litellm") is None:
                    print("litellm is not installed: skipped", file=sys.stderr)
                else:
                    relays.append(start_litellm(upstream, relay_cores))
            direct = Conn(up_port, "/v1/chat/completions", KEY)

            async def all_rounds() -> None:
                warm = argparse.Namespace(**{**vars(args), "requests": 200, "streams": 16, "sequential": 20})
                await measure_round(relays, direct, warm)  # connections, imports, first-request paths
                for r in relays:
                    r.samples.clear()
                for n in range(args.rounds):
                    await measure_round(relays, direct, args)
                    print(f"  round {n + 1}/{args.rounds} done", file=sys.stderr)

            asyncio.run(all_rounds())
            note = (
                f"Relays pinned to core(s) {sorted(relay_cores) if relay_cores else 'any'}; "
                f"{args.rounds} interleaved rounds, medians; {args.requests} requests per throughput "
                f"figure, {args.streams} streams x {args.chunks} chunks; {machine_note()}."
            )
            report(relays, note)
            verdict(relays)
        finally:
            for r in relays:
                r.proc.terminate()
                r.proc.wait(timeout=30)


def python_load(r: Relay, requests: int) -> float:
    """64 concurrent from this process's own client; the relay's CPU seconds per request."""
    before = tree_cpu(r.proc.pid)
    r.add("rps64", asyncio.run(rps(r.port, r.path, r.key, requests, 64)))
    return (tree_cpu(r.proc.pid) - before) / (requests + 64)


def wrk_load(r: Relay, seconds: float) -> float:
    """64 concurrent from wrk; the relay's CPU seconds per request."""
    before = tree_cpu(r.proc.pid)
    done = c_peers.wrk(f"http://127.0.0.1:{r.port}{r.path}", r.key, json.dumps(BODY), 64, seconds)
    if done.errors:
        raise RuntimeError(f"{r.name}: {done.errors} failed requests under wrk")
    r.add("rps64", done.rps)
    return (tree_cpu(r.proc.pid) - before) / done.requests


def run_workers(args: argparse.Namespace, upstream: str) -> None:
    """``--workers 1, 2, N`` at 64 concurrent, nothing pinned. Where nginx and wrk are installed
    they are the upstream and the load (a few tens of microseconds per request each), so the
    cores go to the relay; otherwise the Python upstream and client share the cores with it."""
    cores = os.cpu_count() or 1
    counts = sorted({1, 2, cores}) if cores > 1 else [1]
    nginx = c_peers.NginxUpstream(_free_port(), b"".join(short_sse())) if c_peers.available() else None
    if nginx is not None:
        upstream = f"http://127.0.0.1:{nginx.port}/v1"
    seconds = max(3.0, args.requests / 400)
    me = [sys.executable, "-m", "benchmarks.relay"]
    with tempfile.TemporaryDirectory() as tmp:
        relays = [start_kimi(tmp, f"kimi workers={n}", upstream, None, workers=n, stored=True) for n in counts]
        # The same scaling for the floor: what the machine allows any relay with these peers.
        for n in counts:
            port = _free_port()
            proc = start([*me, "--serve-bare-wire", str(port), upstream, str(n)], port, None)
            relays.append(Relay(f"bare wire x{n}", port, proc))
        try:
            for r in relays:  # every worker up and warm (/health answered once the first was)
                time.sleep(2)
                asyncio.run(rps(r.port, r.path, r.key, 500, 64))
            for _ in range(args.rounds):
                for r in relays:
                    r.add("cpu64", wrk_load(r, seconds) if nginx is not None else python_load(r, args.requests))
        finally:
            for r in relays:
                r.proc.terminate()
                r.proc.wait(timeout=30)
            if nginx is not None:
                nginx.close()
    report_workers(relays, cores, with_c_peers=nginx is not None)


def report_workers(relays: list[Relay], cores: int, *, with_c_peers: bool) -> None:
    one = relays[0].median("rps64")
    peers = (
        "nginx as the upstream and wrk as the load (C, a few tens of microseconds per request each)"
        if with_c_peers
        else "the Python upstream and client (install nginx and wrk for peers that leave the cores to the relay)"
    )
    print(f"\n--workers scaling (stored key, 64 concurrent, not pinned, {cores} cores shared with {peers}):")
    by = {r.name: r for r in relays}
    for r in relays:
        first = by[r.name.rsplit("=", 1)[0] + "=1"] if "=" in r.name else by[r.name.rsplit("x", 1)[0] + "x1"]
        print(
            f"  {r.name:18} {r.median('rps64'):8,.0f} requests/s  {r.median('rps64') / first.median('rps64'):.2f}x "
            f"one process  CPU per request {r.median('cpu64') * 1000:.2f} ms (all processes)"
        )
    if "kimi workers=2" in by:
        two = by["kimi workers=2"].median("rps64") / one
        floor = by["bare wire x2"].median("rps64") / by["bare wire x1"].median("rps64")
        print(f"  --workers 2 vs 1: {two:.2f}x  target >= 1.7x  {'ok' if two >= 1.7 else 'MISSED'}")
        print(f"  the floor's 2 vs 1 on the same machine and peers: {floor:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer requests: a few minutes in all")
    parser.add_argument("--requests", type=int, default=3000, help="requests per throughput figure")
    parser.add_argument("--sequential", type=int, default=200, help="sequential requests per round")
    parser.add_argument("--streams", type=int, default=48)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", action="store_true", help="also the --workers 1, 2, N scaling run")
    parser.add_argument("--workers-only", action="store_true", help="only the --workers scaling run")
    parser.add_argument("--litellm", action="store_true", help="also LiteLLM's proxy, where installed")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare-wire", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        return serve_upstream(args.serve_upstream, args.chunks)
    if args.serve_bare:
        return serve_bare(int(args.serve_bare[0]), args.serve_bare[1], int(args.serve_bare[2]))
    if args.serve_bare_wire:
        return serve_bare_wire(int(args.serve_bare_wire[0]), args.serve_bare_wire[1], int(args.serve_bare_wire[2]))
    if args.quick:
        args.requests, args.sequential, args.streams = 1000, 100, 32

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    relay_cores = {cores[-1]} if len(cores) > 1 else None
    others = set(cores[:-1]) if len(cores) > 1 else None
    pin(os.getpid(), others)
    up_port = _free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    up = start(
        [sys.executable, "-m", "benchmarks.relay", "--chunks", str(args.chunks), "--serve-upstream", str(up_port)],
        up_port,
        others,
    )
    try:
        if not args.workers_only:
            run_relays(args, upstream, up_port, relay_cores)
        if args.workers or args.workers_only:
            pin(os.getpid(), set(cores) or None)
            run_workers(args, upstream)
    finally:
        up.terminate()
        up.wait(timeout=30)


if __name__ == "__main__":
    main()
