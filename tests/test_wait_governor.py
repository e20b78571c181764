"""cpu_poll auto (engines/llamacpp/wait_governor.py, gomp_dials.py): llama.cpp gets the cores
other work leaves free and spins only while they are all its own; libgomp's settings are found
in a real process and are the ones libgomp itself reports."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from kimi_server.engines.llamacpp import cpu_wait
from kimi_server.engines.llamacpp.gomp_dials import (
    NO_THREAD_LIMIT,
    SPIN_SENTINEL,
    THREAD_SENTINEL,
    Dial,
    GompDials,
    writable_libgomp_ranges,
)
from kimi_server.engines.llamacpp.wait_governor import (
    BUSY_SAMPLES,
    QUIET_SAMPLES,
    SLACK_CORES,
    SLEEPING,
    SPINNING,
    CpuTimes,
    Decision,
    Setting,
    WaitGovernor,
    others_cores,
    read_cpu_times,
)


def test_other_work_is_the_machines_busy_time_less_this_process() -> None:
    before = CpuTimes(busy=100, total=400, own=50)
    # 200 ticks over 2 cores: 150 busy, 50 of them this process's: the others kept 1 core busy.
    after = CpuTimes(busy=250, total=600, own=100)
    assert others_cores(before, after, cores=2) == pytest.approx(1.0)
    assert others_cores(after, after, cores=2) == 0.0
    times = read_cpu_times()
    assert 0 <= times.busy <= times.total and times.own >= 0


def test_fewer_threads_when_others_keep_working_and_more_only_after_quiet() -> None:
    decision = Decision(cores=2, threads=2)
    assert decision.setting == Setting(1, spinning=False)  # until the machine has been seen quiet
    for _ in range(QUIET_SAMPLES - 1):
        assert decision.observe(0.1) == Setting(1, spinning=False)
    assert decision.observe(0.1) == Setting(2, spinning=True)  # all its own: spin
    # A light client beside it (under SLACK_CORES of a core) leaves both cores the engine's.
    for _ in range(2 * BUSY_SAMPLES):
        assert decision.observe(SLACK_CORES - 0.05) == Setting(2, spinning=True)
    # A client's burst (its start, a request parsed) is one reading: not worth halving the speed.
    assert decision.observe(0.8) == Setting(2, spinning=True)
    assert decision.observe(0.0) == Setting(2, spinning=True)
    # Most of a core kept busy: fewer threads once it lasts.
    for _ in range(BUSY_SAMPLES - 1):
        assert decision.observe(0.7) == Setting(2, spinning=True)
    assert decision.observe(0.7) == Setting(1, spinning=False)
    for _ in range(QUIET_SAMPLES):
        decision.observe(0.0)
    assert decision.setting == Setting(2, spinning=True)
    # A whole core taken (another engine decoding): at once, spinning beside it would stall.
    assert decision.observe(1.0) == Setting(1, spinning=False)
    assert decision.observe(0.0) == Setting(1, spinning=False)
    assert decision.observe(0.9) == Setting(1, spinning=False)  # busy again: the quiet count restarts
    for _ in range(QUIET_SAMPLES):
        setting = decision.observe(0.2)
    assert setting == Setting(2, spinning=True)


def test_on_more_cores_the_threads_follow_the_free_ones_and_sleep() -> None:
    decision = Decision(cores=8, threads=8)
    for _ in range(QUIET_SAMPLES):
        decision.observe(0.0)
    assert decision.observe(2.6) == Setting(6, spinning=False)  # a burst's slack, at once
    assert decision.observe(2.6) == Setting(5, spinning=False)  # 8 - 2.6 + slack, once it lasts
    assert decision.observe(4.5) == Setting(4, spinning=False)  # at once; 3 once it lasts
    assert decision.observe(4.6) == Setting(3, spinning=False)  # the busy readings' least drop
    assert decision.observe(7.9) == Setting(1, spinning=False)  # never none
    decision = Decision(cores=8, threads=4)  # four threads asked for: other work on the other
    for _ in range(QUIET_SAMPLES):  # four cores leaves them theirs
        decision.observe(3.5)
    assert decision.setting == Setting(4, spinning=True)


def test_the_governor_sets_libgomps_spin_count_and_thread_limit() -> None:
    spin, limit = ctypes.c_uint64(SPIN_SENTINEL), ctypes.c_uint32(THREAD_SENTINEL)
    dials = GompDials(Dial(ctypes.addressof(spin), ctypes.c_uint64), Dial(ctypes.addressof(limit), ctypes.c_uint32))
    governor = WaitGovernor(dials, threads=2, cpus=frozenset({0, 1}), read=lambda: CpuTimes(0, 0, 0))
    assert (spin.value, limit.value) == (SLEEPING, 1)  # one thread, asleep, from the start
    quiet, busy = CpuTimes(0, 200, 0), CpuTimes(100, 400, 0)
    state = CpuTimes(0, 0, 0)
    for _ in range(QUIET_SAMPLES):
        governor.step(state, quiet)
    assert (spin.value, limit.value) == (SPINNING, NO_THREAD_LIMIT)
    assert governor.figures() == {"cpu_threads": 2, "cpu_spinning": 1, "cpu_changes": 1}
    for _ in range(BUSY_SAMPLES):  # 100 of 200 ticks busy, none of them its own: a core taken
        governor.step(quiet, busy)
    assert (spin.value, limit.value) == (SLEEPING, 1)
    governor.stop()
    assert (spin.value, limit.value) == (SLEEPING, 1)


FIND_IN_A_REAL_PROCESS = """
import ctypes, ctypes.util, json
from kimi_server.engines.llamacpp.cpu_wait import apply_wait_level
apply_wait_level("auto")
import xllamacpp  # loads libgomp, which reads its environment now
from kimi_server.engines.llamacpp.gomp_dials import locate
dials = locate()
gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
before = (dials.spin_count.read(), dials.thread_limit.read(), gomp.omp_get_thread_limit())
dials.thread_limit.set(3)
dials.spin_count.set(0)
print(json.dumps([*before, gomp.omp_get_thread_limit(), dials.spin_count.read()]))
"""


def test_libgomps_settings_are_found_in_a_process_that_loads_llamacpp() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_THREAD_LIMIT")}
    done = subprocess.run(
        [sys.executable, "-c", FIND_IN_A_REAL_PROCESS], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    spin, limit, reported, reported_after, spin_after = json.loads(done.stdout.strip().splitlines()[-1])
    assert (spin, limit, reported) == (SPIN_SENTINEL, THREAD_SENTINEL, THREAD_SENTINEL)
    # The word found is libgomp's own thread limit: its API reports what was written there.
    assert (reported_after, spin_after) == (3, 0)


def test_sentinels_are_the_servers_own_and_an_operators_variables_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_THREAD_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    assert cpu_wait.governed("auto") and not cpu_wait.governed(0)
    # Inherited from a server process that started this one: still the governor's.
    monkeypatch.setenv("GOMP_SPINCOUNT", str(SPIN_SENTINEL))
    monkeypatch.setenv("OMP_THREAD_LIMIT", str(THREAD_SENTINEL))
    assert cpu_wait.governed("auto")
    monkeypatch.setenv("OMP_THREAD_LIMIT", "2")  # the operator's choice
    assert not cpu_wait.governed("auto")


def test_maps_lines_of_other_libraries_are_not_searched() -> None:
    maps = "\n".join(
        [
            "7f00-7f10 r--p 00000000 fe:00 1 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0",
            "7f10-7f20 rw-p 00046000 fe:00 1 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0",
            "7f20-7f30 rw-p 00001000 fe:00 2 /usr/lib/x86_64-linux-gnu/libc.so.6",
            "7f30-7f40 rw-p 00000000 00:00 0",
        ]
    )
    assert writable_libgomp_ranges(maps) == [(0x7F10, 0x7F20)]
