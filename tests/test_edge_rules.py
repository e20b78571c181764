"""The rules behind the connection-level limits, on their own: the body pace, the caps sized
from the descriptor limit, and the accept-error digest (tests/test_edge_e2e.py runs them in
the real server)."""

from __future__ import annotations

import logging
from pathlib import Path

from kimi_server.http.accept_errors import ACCEPT_FAILED, AcceptErrorDigest
from kimi_server.http.body_pace import BodyPace
from kimi_server.http.connection_gate import ConnectionCaps, ConnectionGate
from kimi_server.settings import Settings


def test_a_body_breaks_its_pace_past_the_deadline_or_under_the_rate_after_the_grace() -> None:
    pace = BodyPace(timeout=60, min_rate=1000, grace=5)
    assert not pace.broken(elapsed=4.9, received=0)  # within the grace nothing is owed
    assert not pace.broken(elapsed=10, received=5_000)  # 1000 bytes/s since the grace
    assert pace.broken(elapsed=10, received=4_999)
    assert pace.broken(elapsed=60, received=10**9)  # fast, but past the deadline
    no_rate = BodyPace(timeout=60, min_rate=0, grace=0)
    assert not no_rate.broken(elapsed=59, received=0)


def test_unset_caps_follow_the_descriptor_limit(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    caps = ConnectionCaps.from_settings(settings, descriptors=1024)
    assert caps.total == (1024 - 128) // 2 and caps.per_address == caps.total // 4
    # What a burst of accepted connections can take before any is looked at stays inside
    # the limit: caps, lingering connections and a few accept batches.
    assert caps.total + caps.lingering + 3 * caps.backlog < 1024 - 64
    set_caps = ConnectionCaps.from_settings(
        Settings(data_dir=tmp_path, http_max_connections=10, http_max_connections_per_ip=0), descriptors=1024
    )
    assert (set_caps.total, set_caps.per_address) == (10, 0)


def test_the_gate_refuses_past_either_cap_and_frees_places_on_leave() -> None:
    turned_away: list[int] = []
    caps = ConnectionCaps(total=3, per_address=2, lingering=1, backlog=16)
    gate = ConnectionGate(caps, lambda: turned_away.append(1))
    assert gate.enter("a") is None and gate.enter("a") is None
    assert gate.enter("a") is not None  # per address
    assert gate.enter("b") is None
    assert gate.enter("c") is not None  # in all
    gate.leave("a")
    assert gate.enter("c") is None
    assert len(turned_away) == 2 and gate.open == 3
    assert gate.start_lingering() and not gate.start_lingering()
    gate.stop_lingering()
    assert gate.start_lingering()


def test_accept_failures_are_one_line_per_interval_with_a_count() -> None:
    now = [0.0]
    digest = AcceptErrorDigest(interval=10, clock=lambda: now[0])
    error = OSError(24, "Too many open files")

    def failure() -> logging.LogRecord:
        message = ACCEPT_FAILED + "\nsocket: x"
        return logging.LogRecord("asyncio", logging.ERROR, "", 0, message, (), (OSError, error, None))

    first = failure()
    assert digest.filter(first) and first.exc_info is None
    assert "Too many open files" in first.getMessage()
    assert [digest.filter(failure()) for _ in range(500)] == [False] * 500
    now[0] = 10.5
    later = failure()
    assert digest.filter(later) and "500 more" in later.getMessage()
    other = logging.LogRecord("asyncio", logging.ERROR, "", 0, "something else", (), None)
    assert digest.filter(other)
