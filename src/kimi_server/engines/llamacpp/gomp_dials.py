"""Two of libgomp's settings, changed while llama.cpp runs.

libgomp (the OpenMP runtime xllamacpp's llama.cpp runs its CPU threads on) reads its
environment once, when it loads, into variables its threads read again at every wait and every
parallel region: the spin count (``GOMP_SPINCOUNT``: how long a waiting thread spins before it
sleeps) and the thread limit (``OMP_THREAD_LIMIT``: the most threads a parallel region gets;
ggml takes the count it is given). Neither variable is exported, so each is found by its value:
the process loads llama.cpp with each set to a sentinel no other setting uses, and the one
aligned word holding that value in libgomp's writable data is the variable. Found exactly once,
it can be set (an aligned store, which the threads see whole); found zero or several times
(another OpenMP runtime, or none), nothing is written.
"""

from __future__ import annotations

import ctypes
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Close to libgomp's default of 300,000 spins (cpu_poll 50), and a number nothing else holds.
SPIN_SENTINEL = 299_993
# More threads than any machine has: left in place, it limits nothing.
THREAD_SENTINEL = 299_989
NO_THREAD_LIMIT = 0xFFFF_FFFF  # libgomp's "infinity"


Word = type[ctypes.c_uint64] | type[ctypes.c_uint32]


@dataclass(frozen=True)
class Dial:
    address: int
    ctype: Word

    def read(self) -> int:
        return int(self.ctype.from_address(self.address).value)

    def set(self, value: int) -> None:
        self.ctype.from_address(self.address).value = value


@dataclass(frozen=True)
class GompDials:
    spin_count: Dial  # unsigned long long gomp_spin_count_var
    thread_limit: Dial  # unsigned int gomp_global_icv.thread_limit_var


def writable_libgomp_ranges(maps: str) -> list[tuple[int, int]]:
    """The writable, readable mappings of a libgomp in ``/proc/self/maps`` text."""
    ranges = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) < 6 or not fields[1].startswith("rw"):
            continue
        if not Path(fields[5]).name.startswith("libgomp"):
            continue
        start, end = (int(part, 16) for part in fields[0].split("-"))
        ranges.append((start, end))
    return ranges


def _find(ranges: list[tuple[int, int]], value: int, ctype: Word) -> Dial | None:
    width = ctypes.sizeof(ctype)
    wanted = struct.pack("<Q" if width == 8 else "<I", value)
    found: list[int] = []
    for start, end in ranges:
        data = ctypes.string_at(start, end - start)
        at = data.find(wanted)
        while at != -1:
            if (start + at) % width == 0:
                found.append(start + at)
            at = data.find(wanted, at + 1)
    return Dial(found[0], ctype) if len(found) == 1 else None


def locate() -> GompDials | None:
    """Both variables of the libgomp loaded in this process, or None."""
    try:
        ranges = writable_libgomp_ranges(Path("/proc/self/maps").read_text())
    except OSError:
        return None
    spin = _find(ranges, SPIN_SENTINEL, ctypes.c_uint64)
    threads = _find(ranges, THREAD_SENTINEL, ctypes.c_uint32)
    if spin is None or threads is None:
        log.warning(
            "cpu_poll auto: libgomp's settings were not found in this process; llama.cpp's threads keep "
            "spinning as at cpu_poll 50 (set cpu_poll = 0 on a machine shared with other work)"
        )
        return None
    return GompDials(spin, threads)
