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
- ``litellm``: LiteLLM's proxy, only where it is installed (``--litellm``);
- ``kimi httpx``: ``kimi stored`` again with its relayed calls on httpx rather than its own
  upstream client (``KIMI_UPSTREAM_TRANSPORT=httpx``), with ``--client httpx``: what the own
  client saves, printed as ratios to this run.

Measured, interleaved round by round so load from elsewhere falls on every relay alike:
added latency p50 / p99 (sequential requests, minus calling the upstream directly); requests/s
at 32 and 64 concurrent non-streaming requests; SSE events/s at 16 concurrent streams; and the
relay's own CPU time per request and per event (from /proc, its whole process tree). The load
generator is a raw keep-alive HTTP/1.1 client, one connection per worker, so it is never what
limits a relay. ``--workers`` adds a scaling run: kimi-server with ``--workers 1, 2, N`` on
N cores at 64 concurrent, with nginx as the upstream and wrk as the load where both are
installed (``benchmarks/c_peers.py``), so that the peers leave the cores to the relay.

    python benchmarks/relay.py [--quick] [--rounds 3] [--requests 2000] [--workers] [--litellm] [--client httpx]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import c_peers
from benchmarks._measure import machine_note
from benchmarks._server import KEY, _free_port
from benchmarks.relay_load import BODY, Conn, events, pin, rps, sequential, start, tree_cpu
from benchmarks.relay_peers import serve_bare, serve_bare_wire, serve_upstream, short_sse
from benchmarks.relay_report import Relay, client_share, report, report_workers, verdict


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
    tmp: str,
    name: str,
    upstream: str,
    cores: set[int] | None,
    workers: int = 1,
    stored: bool = False,
    transport: str = "auto",
) -> Relay:
    port = _free_port()
    data = os.path.join(tmp, name.replace(" ", "-"))
    env = {**KIMI_ENV, "KIMI_DATA_DIR": data, "KIMI_UPSTREAM_TRANSPORT": transport}
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
            if args.client == "httpx":
                relays.append(start_kimi(tmp, "kimi httpx", upstream, relay_cores, stored=True, transport="httpx"))
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
            if args.client == "httpx":
                client_share(relays)
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
    parser.add_argument(
        "--client",
        choices=["own", "httpx"],
        default="own",
        help="httpx: also kimi-server with its relayed calls on httpx, against its own client",
    )
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
