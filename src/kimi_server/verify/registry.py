"""The check registry: each group's checks, in the order a run prints them.

A check is a function of the target that returns a short note (or nothing) when it passes and
raises ``Failed`` / ``Skipped`` / ``Info`` otherwise. ``per_model`` checks run once for each
model under test; the others on the first one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line lists the groups without loading the HTTP clients
    from kimi_server.verify.target import Target

CheckFn = Callable[["Target", str], "str | None"]

# Printed and run in this order.
GROUPS = (
    "params",
    "effort",
    "contract",
    "streaming",
    "usage",
    "tools",
    "structured",
    "partial",
    "dynamic_tools",
    "web_search",
    "media",
    "files",
    "estimate",
    "balance",
    "responses",
    "messages",
    "errors",
    "cache",
    "latency",
)


# Run alone, after the others: a cache hit must not lose its slot to concurrent requests, and
# latency figures mean little under the run's own load. A check of another group may ask the
# same (``serial=True``).
SERIAL = ("cache", "latency")


@dataclass(frozen=True)
class Check:
    group: str
    name: str
    fn: CheckFn
    per_model: bool
    serial: bool = False  # run alone, after the concurrent checks

    @property
    def alone(self) -> bool:
        return self.serial or self.group in SERIAL


REGISTRY: list[Check] = []


def check(group: str, name: str, *, per_model: bool = False, serial: bool = False) -> Callable[[CheckFn], CheckFn]:
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}")

    def register(fn: CheckFn) -> CheckFn:
        REGISTRY.append(Check(group, name, fn, per_model, serial))
        return fn

    return register


def load() -> list[Check]:
    """Every registered check, grouped in GROUPS order (importing the group modules registers them)."""
    import kimi_server.verify.checks  # noqa: F401

    return sorted(REGISTRY, key=lambda c: GROUPS.index(c.group))
