"""What ``benchmarks/relay.py`` measured, per relay, and how it is printed: the table, the
verdict against the issue's targets and the floor, and the ``--workers`` scaling."""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks._server import KEY
from benchmarks.relay_load import rss_mb


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


def client_share(relays: list[Relay]) -> None:
    """kimi-server on its own upstream client against itself on httpx (``--client httpx``): the
    same server, key, limits and ledger, so the difference is the client's."""
    by = {r.name: r for r in relays}
    own, on_httpx = by["kimi stored"], by["kimi httpx"]
    print("\nkimi-server's own upstream client against httpx (stored key; baseline: kimi httpx), no target:")
    print(f"  requests per CPU-second   {on_httpx.median('cpu64') / own.median('cpu64'):.2f}x")
    print(f"  SSE events per CPU-second {on_httpx.median('cpu_event') / own.median('cpu_event'):.2f}x")
    print(f"  requests/s at 64          {own.median('rps64') / on_httpx.median('rps64'):.2f}x")
    print(f"  added latency p50         {own.median('added') / on_httpx.median('added'):.2f}x httpx's")
    saved = 1 - own.median("cpu64") / on_httpx.median("cpu64")
    print(f"  CPU per request the own client saves: {saved:.0%} of kimi-server's on httpx")


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
