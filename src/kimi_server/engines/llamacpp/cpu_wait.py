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

``"auto"`` (the default) loads llama.cpp with the sentinel spin count that ``spin_dial.py``
finds it by; ``wait_governor.py`` then spins or sleeps as the machine's other work allows.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

from kimi_server.engines.llamacpp.spin_dial import SENTINEL

log = logging.getLogger(__name__)

SPINS_PER_LEVEL = 6_000  # level 50 -> 300,000 spins, libgomp's default
_OPERATOR_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


CpuPoll = int | Literal["auto"]


def spin_count(poll: CpuPoll) -> int:
    return SENTINEL if poll == "auto" else max(0, poll) * SPINS_PER_LEVEL


def pool_poll(poll: CpuPoll) -> int:
    """llama.cpp's own pool level (builds without OpenMP): ``auto`` leaves it asleep."""
    return 0 if poll == "auto" else poll


def governed(poll: CpuPoll) -> bool:
    """Whether the process's spin count is left to the governor: ``auto``, and the operator set
    no OpenMP variable of their own."""
    return poll == "auto" and not any(name in os.environ for name in _OPERATOR_VARIABLES)


def apply_wait_level(poll: CpuPoll) -> None:
    """Sets libgomp's spin count for ``poll`` unless the operator set OpenMP's own variables,
    or xllamacpp was already imported (then too late: warns if it differs)."""
    if any(name in os.environ for name in _OPERATOR_VARIABLES):
        return
    wanted = str(spin_count(poll))
    if "xllamacpp" in sys.modules:
        if os.environ.get("GOMP_SPINCOUNT") != wanted:
            log.warning("llama.cpp was loaded before cpu_poll %s could apply to its threads", poll)
        return
    os.environ["GOMP_SPINCOUNT"] = wanted
