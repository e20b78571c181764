"""Interleaved measurement and honest summaries, shared by the benchmarks.

A baseline and the variant it is compared with run in the same process, alternately (A, B, A,
B, ...), so that load from elsewhere on the machine falls on both alike; each side reports its
median and its spread (min-max), and the comparison is the ratio of the medians.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

MIN_ROUNDS = 3


def interleave(rounds: int, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Calls every side once per round, in order, ``rounds`` times; returns the samples."""
    if rounds < MIN_ROUNDS:
        raise SystemExit(f"--rounds must be at least {MIN_ROUNDS}")
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, measure in sides.items():
            samples[name].append(measure())
    return samples


def spread(values: list[float], unit: str = "", digits: int = 2) -> str:
    """``median unit [min-max, n=N]``."""
    med = statistics.median(values)
    return f"{med:.{digits}f}{unit} [{min(values):.{digits}f}-{max(values):.{digits}f}, n={len(values)}]"


def ratio(variant: list[float], baseline: list[float]) -> float:
    return statistics.median(variant) / statistics.median(baseline)


def machine_note() -> str:
    """What else was running: the 1-minute load average against the core count."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return f"{os.cpu_count()} cores"
    return f"{os.cpu_count()} cores, load average {load:.1f} at the end"
