"""How llama.cpp's CPU threads wait for each other: asleep, or spinning.

Every decoding step is split across the threads, which meet at a barrier after each operation.
xllamacpp's build runs those threads on OpenMP (libgomp), whose barrier spins before it sleeps;
llama.cpp's own thread pool (``CpuParams.poll``) does the same between steps. Spinning saves
microseconds on cores nobody else uses. On cores shared with other work it costs far more: a
spinning thread burns the time slice that the thread it waits for needs, so a request slowed
many times over (benchmarks/cpu_share.py measures it beside a CPU hog and another engine).

``cpu_poll`` (0-100, llama.cpp's polling level) sets both: llama.cpp's ``poll`` and libgomp's
spin count, scaled so that 50, llama.cpp's default, is libgomp's default of 300,000 spins and 0
sleeps at once. libgomp reads its environment once, when xllamacpp is first imported, so the
level must be applied before that, and one process has one level.

``"auto"`` (the default) loads llama.cpp with the sentinels ``gomp_dials.py`` finds libgomp's
spin count and thread limit by; ``wait_governor.py`` then sets both as the machine's other work
allows.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

from kimi_server.engines.llamacpp.gomp_dials import SPIN_SENTINEL, THREAD_SENTINEL

log = logging.getLogger(__name__)

SPINS_PER_LEVEL = 6_000  # level 50 -> 300,000 spins, libgomp's default
_OPERATOR_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_THREAD_LIMIT")


CpuPoll = int | Literal["auto"]


def spin_count(poll: CpuPoll) -> int:
    return SPIN_SENTINEL if poll == "auto" else max(0, poll) * SPINS_PER_LEVEL


def pool_poll(poll: CpuPoll) -> int:
    """llama.cpp's own pool level (builds without OpenMP): ``auto`` leaves it asleep."""
    return 0 if poll == "auto" else poll


def operator_set() -> bool:
    """Whether the operator set OpenMP's variables themselves. The sentinels are this module's
    own (perhaps inherited from the server process that started this one), never a choice."""
    ours = {"GOMP_SPINCOUNT": str(SPIN_SENTINEL), "OMP_THREAD_LIMIT": str(THREAD_SENTINEL)}
    return any(name in os.environ and os.environ[name] != ours.get(name) for name in _OPERATOR_VARIABLES)


def governed(poll: CpuPoll) -> bool:
    """Whether libgomp's settings are left to the governor: ``auto``, unless the operator set
    OpenMP's variables themselves."""
    return poll == "auto" and not operator_set()


def apply_wait_level(poll: CpuPoll) -> None:
    """Sets libgomp's variables for ``poll`` unless the operator set them, or xllamacpp was
    already imported (then too late: warns if they differ)."""
    if operator_set():
        return
    wanted = {"GOMP_SPINCOUNT": str(spin_count(poll))}
    if poll == "auto":
        wanted["OMP_THREAD_LIMIT"] = str(THREAD_SENTINEL)
    if "xllamacpp" in sys.modules:
        if any(os.environ.get(name) != value for name, value in wanted.items()):
            log.warning("llama.cpp was loaded before cpu_poll %s could apply to its threads", poll)
        return
    os.environ.update(wanted)
    if poll != "auto":
        os.environ.pop("OMP_THREAD_LIMIT", None)  # a sentinel inherited from a parent process
