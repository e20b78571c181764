"""What the Messages door costs against Chat Completions for the same streamed answer relayed.

One run starts the relay benchmark's fast fake upstream (it streams ``--chunks`` text deltas at
once) and one ``kimi-server serve --upstream`` pinned to the last core, then streams the same
answer through ``/v1/chat/completions`` and ``/v1/messages`` in interleaved rounds, and reads the
server's own CPU time (its whole process tree, from /proc) around each side. The Messages stream
carries more framing per answer (message_start, a block start and stop, message_delta,
message_stop, the thinking signature); the figure is CPU per text delta relayed, so that framing
counts against it.

    python -m benchmarks.messages_relay [--rounds 5] [--streams 48] [--chunks 200]

Prints ``messages / chat CPU per event = R x`` (the target is at most 1.1x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from benchmarks._measure import interleave, machine_note, ratio, spread
from benchmarks._server import KEY, _free_port
from benchmarks.relay import start_kimi
from benchmarks.relay_load import Conn, pin, start, tree_cpu

CHAT: dict[str, Any] = {
    "model": "kimi-k3.1-pro",
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 1000,
    "stream": True,
}
MESSAGES: dict[str, Any] = {**CHAT, "max_tokens": 1000}
TARGET = 1.1


async def stream_all(port: int, path: str, body: dict[str, Any], streams: int, marker: bytes) -> int:
    """``streams`` streams, 16 at once; the number of text deltas received."""
    raw = json.dumps(body).encode()
    conns = [Conn(port, path, KEY) for _ in range(16)]
    queue = iter(range(streams))
    deltas = 0

    async def worker(conn: Conn) -> None:
        nonlocal deltas
        for _ in queue:
            status, data = await conn.post(raw)
            if status != 200:
                raise RuntimeError(f"{path}: HTTP {status}: {data[:200]!r}")
            deltas += data.count(marker)

    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        c.close()
    return deltas


def side(pid: int, port: int, path: str, body: dict[str, Any], streams: int, marker: bytes) -> Callable[[], float]:
    """One measurement: the server's CPU microseconds per text delta relayed."""

    def measure() -> float:
        before = tree_cpu(pid)
        deltas = asyncio.run(stream_all(port, path, body, streams, marker))
        return (tree_cpu(pid) - before) / max(deltas, 1) * 1e6

    return measure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", type=int, default=48)
    parser.add_argument("--chunks", type=int, default=200)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    server_cores = {cores[-1]} if len(cores) > 1 else None
    others = set(cores[:-1]) if len(cores) > 1 else None
    pin(os.getpid(), others)
    up_port = _free_port()
    upstream_cmd = [sys.executable, "-m", "benchmarks.relay", "--chunks", str(args.chunks)]
    up = start([*upstream_cmd, "--serve-upstream", str(up_port)], up_port, others)
    with tempfile.TemporaryDirectory() as tmp:
        kimi = start_kimi(tmp, "kimi", f"http://127.0.0.1:{up_port}/v1", server_cores)
        try:
            pid, port = kimi.proc.pid, kimi.port
            chat = side(pid, port, "/v1/chat/completions", CHAT, args.streams, b'"content":')
            messages = side(pid, port, "/v1/messages", MESSAGES, args.streams, b"event: content_block_delta")
            chat(), messages()  # warm: connections, imports, first-request paths
            samples = interleave(args.rounds, {"chat": chat, "messages": messages})
        finally:
            kimi.proc.terminate()
            kimi.proc.wait(timeout=30)
            up.terminate()
            up.wait(timeout=30)
    print(f"Same answer relayed ({args.chunks} deltas a stream, {args.streams} streams a side, 16 at once); ")
    print(f"server pinned to core(s) {sorted(server_cores) if server_cores else 'any'}; {machine_note()}.")
    for name, values in samples.items():
        print(f"  {name:9s} CPU per delta: {spread(values, ' us', 1)}")
    r = ratio(samples["messages"], samples["chat"])
    print(f"messages / chat CPU per event = {r:.2f} x (target <= {TARGET} x: {'met' if r <= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
