"""libgomp's spin count, changed while llama.cpp runs.

libgomp (the OpenMP runtime xllamacpp's llama.cpp runs its CPU threads on) reads
``GOMP_SPINCOUNT`` once, when it loads, into a variable its threads read again every time they
wait: how many times to spin before sleeping. The variable is not exported, so it is found by
its value: the process loads llama.cpp with ``GOMP_SPINCOUNT`` set to a sentinel no other
setting uses, and the one aligned 64-bit word holding that value in libgomp's writable data is
the variable. Found exactly once, it can be set (an aligned 64-bit store, which the threads see
whole); found zero or several times (another OpenMP runtime, or none), nothing is written.
"""

from __future__ import annotations

import ctypes
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Close to libgomp's default of 300,000 spins (cpu_poll 50), and a number nothing else holds.
SENTINEL = 299_993
WORD = 8


@dataclass(frozen=True)
class SpinDial:
    address: int

    def read(self) -> int:
        return int(ctypes.c_uint64.from_address(self.address).value)

    def set(self, spins: int) -> None:
        ctypes.c_uint64.from_address(self.address).value = max(0, spins)


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


def locate(sentinel: int = SENTINEL) -> SpinDial | None:
    """The spin-count variable of the libgomp loaded in this process, or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    wanted = struct.pack("<Q", sentinel)
    found: list[int] = []
    for start, end in writable_libgomp_ranges(maps):
        data = ctypes.string_at(start, end - start)
        at = data.find(wanted)
        while at != -1:
            if (start + at) % WORD == 0:
                found.append(start + at)
            at = data.find(wanted, at + 1)
    if len(found) != 1:
        log.info("libgomp's spin count not found (%d candidates): threads keep the level they loaded with", len(found))
        return None
    return SpinDial(found[0])
