"""The parts of the guessing throttle on their own: the schedule of waits and locks, the counts
(in process, and in the file the workers share), what an attempt is counted under, the sign-in
form's signed token, and the start-up check of operator keys. The server tests are in
test_auth_throttle.py."""

from __future__ import annotations

import asyncio
import secrets
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from kimi_server.console.login_token import LIFETIME, LoginTokens
from kimi_server.gate.auth_throttle import ThrottleLimits, buckets_of, client_address, prefix_fingerprint
from kimi_server.gate.failure_counts import Buckets, LocalCounts
from kimi_server.gate.failure_counts_mapped import MappedCounts
from kimi_server.gate.key_strength import check_operator_keys, weakness
from kimi_server.settings import Settings

LIMITS = ThrottleLimits(address=20, prefix=100, window=600.0, max_delay=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_failures_wait_longer_and_longer_then_lock_for_window_over_limit() -> None:
    waits = [LIMITS.delay(level, 20) for level in range(1, 21)]
    assert waits[:4] == [0.0] * 4  # the first quarter is answered at once
    assert waits[18] == 2.0 and waits[17] == 1.0 and waits[16] == 0.5  # doubling up to the most
    assert all(a <= b for a, b in pairwise(waits[:19]))
    assert LIMITS.wait(19.0, 20) is None and LIMITS.wait(18.9, 20) is None
    assert LIMITS.wait(20.0, 20) == pytest.approx(30.0)  # one more try every window / limit
    assert LIMITS.delay(20.0, 20) == 0.0  # a locked attempt is refused at once, not delayed
    assert LIMITS.wait(5.0, 0) is None and LIMITS.delay(5.0, 0) == 0.0  # a limit of 0 is off


def test_counts_drain_over_the_window_and_known_addresses_expire() -> None:
    clock = Clock()
    counts = LocalCounts(LIMITS.drain, clock)
    b = Buckets("a:203.0.113.9", "p:abc", "k:abc:203.0.113.9")
    for _ in range(3):
        tally = counts.add_now(b)
    assert tally.address == 3 and tally.prefix == 3 and not tally.known
    clock.now += 6  # each drains limit / window per second: 20 / 600 and 100 / 600
    assert counts.read_now(b).address == pytest.approx(3 - 6 * 20 / 600)
    assert counts.read_now(b).prefix == pytest.approx(2.0)
    counts.remember_now(b.known)
    assert counts.read_now(b).known
    clock.now += LIMITS.drain.remember + 1
    assert counts.read_now(b).address == 0 and not counts.read_now(b).known


def test_two_workers_on_one_file_count_together_and_reuse_drained_slots(tmp_path: Path) -> None:
    clock = Clock()

    async def run() -> None:
        a = MappedCounts(tmp_path / "f.map", LIMITS.drain, slots=4, clock=clock)
        b = MappedCounts(tmp_path / "f.map", LIMITS.drain, slots=4, clock=clock)
        first = Buckets("a:x", "p:1", "k:1:x")
        await a.add(first)
        assert (await b.add(first)).address == 2  # one count across the two
        await b.remember(first.known)
        assert (await a.read(first)).known
        other = Buckets("a:y", "p:2", "k:2:y")  # the table (4 slots) is now full
        assert (await a.add(other)).address == 1  # counted by this worker alone, not refused
        assert (await b.read(other)).address == 0
        clock.now += LIMITS.drain.remember + 1  # every count drained, the mark expired
        assert (await b.add(other)).address == 1  # emptied slots are taken again
        assert (await a.read(other)).address == 1
        for counts in (a, b):
            await counts.close()

    asyncio.run(run())


def test_what_an_attempt_is_counted_under() -> None:
    def scope(host: str | None) -> dict[str, object]:
        return {"client": (host, 1234) if host is not None else None}

    assert client_address(scope("203.0.113.9")) == "203.0.113.9"
    assert client_address(scope("::ffff:203.0.113.9")) == "203.0.113.9"
    # One IPv6 host holds a /64: its addresses are one.
    assert client_address(scope("2001:db8:1:2::1")) == client_address(scope("2001:db8:1:2:ffff::9"))
    assert client_address(scope("2001:db8:1:2::1")) != client_address(scope("2001:db8:1:3::1"))
    assert client_address(scope(None)) == "-"
    key = "sk-kimi-" + secrets.token_urlsafe(32)
    same_head = key[:12] + secrets.token_urlsafe(32)
    assert prefix_fingerprint(key) == prefix_fingerprint(same_head) != prefix_fingerprint("sk-kimi-" + "x" * 40)
    buckets = buckets_of("203.0.113.9", key)
    assert not any(key[:12] in name or key[8:12] in name for name in vars(buckets).values())
    # A short key is counted by its first half only.
    assert prefix_fingerprint("abcdefgh") == prefix_fingerprint("abcdZZZZ") != prefix_fingerprint("abcZZZZZ")


def test_the_sign_in_token_is_signed_recent_and_names_its_cookie() -> None:
    tokens = LoginTokens(secrets.token_bytes(32))
    nonce, token = tokens.issue(now=1_000_000)
    assert tokens.valid(nonce, token, now=1_000_000 + LIFETIME)
    assert not tokens.valid(nonce, token, now=1_000_000 + LIFETIME + 1)  # expired
    assert not tokens.valid(nonce, token, now=1_000_000 - 3600)  # from the future
    assert not tokens.valid("another", token, now=1_000_000)
    assert not tokens.valid(None, token, now=1_000_000)
    assert not LoginTokens(secrets.token_bytes(32)).valid(nonce, token, now=1_000_000)  # another secret
    for garbage in ("", nonce, f"{nonce}.", f"{nonce}.1000000", f"{nonce}.\u00b2.x", f"{nonce}.{'9' * 40}.x"):
        assert not tokens.valid(nonce, garbage, now=1_000_000), garbage


def test_weak_operator_keys_warn_on_loopback_and_stop_start_up_beyond_it(tmp_path: Path) -> None:
    strong = secrets.token_urlsafe(32)
    assert weakness(strong) is None and weakness("sk-" + secrets.token_hex(16)) is None
    for weak in ("sk-admin", "a" * 40, "0123456789abcdef" * 3, "abcdefghijklmnopqrstuvwxyz", "ab" * 30):
        assert weakness(weak) is not None, weak
    assert check_operator_keys(Settings(admin_key=strong, api_keys=[strong], data_dir=tmp_path)) == []
    local = check_operator_keys(Settings(admin_key="sk-admin", api_keys=[strong, "zq9"], data_dir=tmp_path))
    assert len(local) == 2 and "admin key" in local[0] and "API key 2 of 2" in local[1]
    assert not any("sk-admin" in line or "zq9" in line for line in local)  # never the key
    exposed = Settings(host="0.0.0.0", admin_key="sk-admin", data_dir=tmp_path)
    with pytest.raises(ValueError, match="allow_weak_keys"):
        check_operator_keys(exposed)
    assert check_operator_keys(exposed.model_copy(update={"allow_weak_keys": True}))


def test_serve_refuses_a_weak_admin_key_beyond_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(cli_app, ["serve", "--host", "0.0.0.0", "--admin-key", "sk-admin-1"])
    assert result.exit_code == 1
    said = result.stderr
    assert "admin key" in said and "allow_weak_keys" in said and "sk-admin-1" not in said
