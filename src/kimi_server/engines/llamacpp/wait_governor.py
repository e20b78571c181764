"""``cpu_poll = "auto"``: llama.cpp's threads spin while the machine has cores to spare, and
sleep as soon as they wait while other work wants the cores.

Spinning keeps llama.cpp's own speed on cores nobody else uses (a sleeping thread must be woken
at every barrier: the tiny model loses about 60% of its speed); on cores shared with other work,
a spinning thread burns the time slice that the thread it waits for needs, and the engine
collapses (cpu_wait.py). So a thread in this process reads, every ``INTERVAL_S``, how much CPU
the rest of the machine used (``/proc/stat`` less this process's own time) and sets libgomp's
spin count through ``spin_dial.py``: sleeping at once when the others used more than the cores
the engine leaves free, spinning again once they have stayed below it for ``QUIET_SAMPLES`` in
a row. One governor per process: libgomp's spin count is the process's.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kimi_server.engines.llamacpp.spin_dial import SpinDial, locate

log = logging.getLogger(__name__)

INTERVAL_S = 0.2
QUIET_SAMPLES = 3  # 0.6 s of quiet before spinning again; one busy reading sleeps at once
SLACK_CORES = 0.25  # other work below this (beyond the cores the engine leaves free) is noise
SPINNING = 300_000  # libgomp's default
SLEEPING = 0


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative CPU ticks: the whole machine's busy and total, and this process's own."""

    busy: int
    total: int
    own: int


def read_cpu_times(cpus: frozenset[int] | None = None) -> CpuTimes:
    """The ticks of the cores this process may run on (``cpus``; None: all of them)."""
    busy = total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    stat = Path("/proc/self/stat").read_text()
    after_name = stat[stat.rindex(")") + 2 :].split()
    own = int(after_name[11]) + int(after_name[12])  # utime, stime (fields 14 and 15)
    return CpuTimes(busy, total, own)


def others_cores(before: CpuTimes, after: CpuTimes, cores: int) -> float:
    """Cores the rest of the machine kept busy between two readings."""
    total = after.total - before.total
    if total <= 0:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, others) / total * cores


class Decision:
    """Spin or sleep, from successive readings of the others' load."""

    def __init__(self, spare_cores: float) -> None:
        self.spare = spare_cores + SLACK_CORES
        self.spinning = False
        self.quiet = 0

    def observe(self, others: float) -> bool:
        if others > self.spare:
            self.quiet = 0
            self.spinning = False
        else:
            self.quiet += 1
            if self.quiet >= QUIET_SAMPLES:
                self.spinning = True
        return self.spinning


class WaitGovernor:
    def __init__(
        self,
        dial: SpinDial,
        threads: int,
        *,
        cpus: frozenset[int] | None = None,
        read: Callable[[], CpuTimes] | None = None,
        interval: float = INTERVAL_S,
    ) -> None:
        self.dial = dial
        cpus = cpus if cpus is not None else _cpus()
        self.cores = len(cpus)
        self.decision = Decision(max(0, self.cores - threads))
        self.switches = 0
        self._read = read or (lambda: read_cpu_times(cpus))
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kimi-wait-governor", daemon=True)
        dial.set(SLEEPING)  # until the machine has been seen quiet

    @property
    def spinning(self) -> bool:
        return self.decision.spinning

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.dial.set(SLEEPING)

    def step(self, before: CpuTimes, after: CpuTimes) -> None:
        was = self.decision.spinning
        now = self.decision.observe(others_cores(before, after, self.cores))
        if now != was:
            self.switches += 1
            self.dial.set(SPINNING if now else SLEEPING)
            log.debug("llama.cpp threads now %s", "spin" if now else "sleep at once")

    def _run(self) -> None:
        try:
            before = self._read()
            while not self._stop.wait(self._interval):
                after = self._read()
                self.step(before, after)
                before = after
        except (OSError, ValueError, IndexError) as exc:  # no /proc: stay asleep, as cpu_poll 0
            log.warning("cpu_poll auto stopped (%s): llama.cpp's threads sleep at once", exc)
            self.dial.set(SLEEPING)


def _cpus() -> frozenset[int]:
    """The cores this process may run on (a container's or taskset's CPU set)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:
        return frozenset(range(os.cpu_count() or 1))


_lock = threading.Lock()
_governor: WaitGovernor | None = None
_users = 0


def acquire(threads: int) -> WaitGovernor | None:
    """The process's governor, started by its first user once llama.cpp is loaded with the
    sentinel spin count (cpu_wait.py); None where libgomp's spin count cannot be found."""
    global _governor, _users
    with _lock:
        if _governor is None:
            dial = locate()
            if dial is None:
                return None
            _governor = WaitGovernor(dial, threads)
            _governor.start()
        _users += 1
        return _governor


def release(governor: WaitGovernor | None) -> None:
    global _governor, _users
    if governor is None:
        return
    with _lock:
        _users -= 1
        if _users <= 0 and _governor is not None:
            _governor.stop()
            _governor, _users = None, 0
