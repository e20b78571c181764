"""The parent of ``serve --workers N``: uvicorn's supervisor, with the operator's time for a
worker to start and a log line naming why each worker was replaced.

uvicorn pings each worker over a pipe every half second and replaces one that does not answer
within one fixed time (5 s), starting or not. A worker still importing and building its app on a
loaded machine can take longer than that, so healthy workers were killed as they started, over
and over, and the port refused connections meanwhile; and the log said only "Child process
died". Here a worker gets ``worker_start_timeout`` to finish starting, then
``worker_health_timeout`` to answer each check; a worker that is replaced is named in one
warning with the reason (it exited, with its status or signal; it did not start in time; it did
not answer), and its live series leave ``/metrics`` (prometheus-client's ``mark_process_dead``).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from socket import socket

from prometheus_client import multiprocess
from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = logging.getLogger("kimi_server.workers")
READY_POLL = 0.25  # seconds one start-up check waits for a starting worker's answer


class Supervisor(Multiprocess):
    def __init__(self, config: Config, sockets: list[socket], *, start_timeout: float, health_timeout: float) -> None:
        super().__init__(config, sockets)
        self.start_timeout = start_timeout
        self.health_timeout = health_timeout
        self._starting: dict[int, float] = {}  # id(process) -> when it was started (monotonic)

    def _spawn(self) -> Process:
        process = Process(self.config, self.sockets)
        process.start()
        self._starting[id(process)] = time.monotonic()
        return process

    def init_processes(self) -> None:
        self.processes = [self._spawn() for _ in range(self.processes_num)]

    def handle_ttin(self) -> None:
        log.info("Received SIGTTIN, increasing the number of processes.")
        self.processes_num += 1
        self.processes.append(self._spawn())

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return  # the parent is stopping: nothing to replace
        for idx, process in enumerate(self.processes):
            reason = self.why_replace(process)
            if reason is None:
                continue
            pid = process.pid
            process.kill()
            process.join()
            self._starting.pop(id(process), None)
            if pid is not None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
            if process.exitcode == STARTUP_FAILURE:
                # The app, its settings or the socket is broken: every new worker would fail alike.
                log.error("worker [%s] failed to start (see its error above); stopping the server", pid)
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            log.warning("worker [%s] replaced: %s", pid, reason)
            self.processes[idx] = self._spawn()

    def why_replace(self, process: Process) -> str | None:
        """Why ``process`` must be replaced, in words; None while it is well (or still starting
        within its time)."""
        if not process.process.is_alive():
            return _ended(process.process.exitcode)
        started = self._starting.get(id(process))
        if started is not None:
            if process.is_ready(timeout=READY_POLL):
                del self._starting[id(process)]
                return None
            if time.monotonic() - started <= self.start_timeout:
                return None
            return f"it did not finish starting within {self.start_timeout:g} s (worker_start_timeout)"
        if process.ping(timeout=self.health_timeout):
            return None
        return f"it did not answer the health check within {self.health_timeout:g} s (worker_health_timeout)"


def _ended(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the system may have run out of memory)" if -code == signal.SIGKILL else ""
        return f"it was killed by {name}{hint}"
    return f"it exited with status {code}"
