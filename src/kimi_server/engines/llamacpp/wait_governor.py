"""``cpu_poll = "auto"``: llama.cpp gets the cores other work leaves free, and its threads spin
only while those cores are all its own.

Spinning keeps llama.cpp's own speed on cores nobody else uses (a sleeping thread must be woken
at every barrier: the tiny model loses about 60% of its speed). On cores shared with other
work, a spinning thread burns the time slice that the thread it waits for needs, and even
sleeping threads still meet at every barrier, so the slowest one, the one sharing a core, sets
the pace. So a thread in this process reads, every ``INTERVAL_S``, how much CPU the rest of the
machine used on the cores this process may run on (``/proc/stat`` less this process's own
time), and through ``gomp_dials.py`` gives llama.cpp as many threads as there are cores left
free (at least one), spinning only when that is all of them. Quieter: more threads again after
``QUIET_SAMPLES`` readings in a row. Busier: fewer threads after ``BUSY_SAMPLES`` readings, or
at once when a single reading leaves fewer cores free even with ``BURST_CORES`` more of slack.
A client on the same machine shows as a short burst (the process starting, a request being
parsed), and halving llama.cpp's speed for it costs more than its slice of a core; another
engine decoding, even for a short request, takes a whole core in one reading, and spinning
threads beside it lose most of their speed at once. One governor per process: libgomp's
settings are the process's.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kimi_server.engines.llamacpp.gomp_dials import NO_THREAD_LIMIT, GompDials, locate

log = logging.getLogger(__name__)

INTERVAL_S = 0.2
QUIET_SAMPLES = 3  # 0.6 s of quiet before more threads
BUSY_SAMPLES = 2  # 0.4 s of other work before fewer
SLACK_CORES = 0.4  # other work below this is a light client or noise: the core still counts as free
BURST_CORES = 0.5  # one reading's further slack, for a burst (2 cores: more than 0.9 of one drops)
SPINNING = 300_000  # libgomp's default
SLEEPING = 0


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative CPU ticks: the cores' busy and total, and this process's own."""

    busy: int
    total: int
    own: int


def read_cpu_times(cpus: frozenset[int] | None = None) -> CpuTimes:
    """The ticks of the cores in ``cpus`` (None: all of them), and this process's."""
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


@dataclass(frozen=True)
class Setting:
    threads: int
    spinning: bool


class Decision:
    """How many threads, and whether they spin, from successive readings of the others' load."""

    def __init__(self, cores: int, threads: int) -> None:
        self.cores = cores
        self.most = threads
        self.threads = 1 if threads > 1 else threads  # until the machine has been seen quiet
        self.rising = self.falling = 0
        self.rise_to = self.fall_to = threads

    @property
    def setting(self) -> Setting:
        return Setting(self.threads, spinning=self.threads == self.most)

    def observe(self, others: float) -> Setting:
        wanted = self._fitting(others, SLACK_CORES)
        at_once = self._fitting(others, SLACK_CORES + BURST_CORES)
        if at_once < self.threads:
            self.threads, self.rising, self.falling = at_once, 0, 0
        if wanted < self.threads:
            self.rising = 0
            self.fall_to = wanted if self.falling == 0 else max(self.fall_to, wanted)
            self.falling += 1
            if self.falling >= BUSY_SAMPLES:
                self.threads, self.falling = self.fall_to, 0
        elif wanted > self.threads:
            self.falling = 0
            self.rise_to = wanted if self.rising == 0 else min(self.rise_to, wanted)
            self.rising += 1
            if self.rising >= QUIET_SAMPLES:
                self.threads, self.rising = self.rise_to, 0
        else:
            self.rising = self.falling = 0
        return self.setting

    def _fitting(self, others: float, slack: float) -> int:
        """Threads for the cores the others leave free, counting ``slack`` of a core as free."""
        return max(1, min(self.most, math.floor(self.cores - others + slack)))


class WaitGovernor:
    def __init__(
        self,
        dials: GompDials,
        threads: int,
        *,
        cpus: frozenset[int] | None = None,
        read: Callable[[], CpuTimes] | None = None,
        interval: float = INTERVAL_S,
    ) -> None:
        self.dials = dials
        cpus = cpus if cpus is not None else _cpus()
        self.decision = Decision(len(cpus), threads)
        self.changes = 0
        self._read = read or (lambda: read_cpu_times(cpus))
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kimi-wait-governor", daemon=True)
        self._apply(self.decision.setting)

    @property
    def setting(self) -> Setting:
        return self.decision.setting

    def figures(self) -> dict[str, int]:
        setting = self.setting
        return {"cpu_threads": setting.threads, "cpu_spinning": int(setting.spinning), "cpu_changes": self.changes}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._apply(Setting(threads=1, spinning=False))

    def step(self, before: CpuTimes, after: CpuTimes) -> None:
        was = self.decision.setting
        now = self.decision.observe(others_cores(before, after, self.decision.cores))
        if now != was:
            self.changes += 1
            self._apply(now)
            log.debug("llama.cpp now runs %d thread(s), %s", now.threads, "spinning" if now.spinning else "sleeping")

    def _apply(self, setting: Setting) -> None:
        self.dials.spin_count.set(SPINNING if setting.spinning else SLEEPING)
        limit = NO_THREAD_LIMIT if setting.threads >= self.decision.most else setting.threads
        self.dials.thread_limit.set(limit)

    def _run(self) -> None:
        try:
            before = self._read()
            while not self._stop.wait(self._interval):
                after = self._read()
                self.step(before, after)
                before = after
        except (OSError, ValueError, IndexError) as exc:  # no /proc: one thread, asleep
            log.warning("cpu_poll auto stopped (%s): llama.cpp runs one thread", exc)
            self._apply(Setting(threads=1, spinning=False))


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
    sentinels (cpu_wait.py); None where libgomp's settings cannot be found."""
    global _governor, _users
    with _lock:
        if _governor is None:
            dials = locate()
            if dials is None:
                return None
            _governor = WaitGovernor(dials, threads)
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
