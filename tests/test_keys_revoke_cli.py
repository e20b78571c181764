"""``kimi-server keys revoke`` says what it did: a key revoked before is left as it was, and the
command says when that was, with exit status 1 (a script revoking twice learns it did nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app


def test_revoking_a_revoked_key_says_so_and_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()
    made = runner.invoke(cli_app, ["keys", "create", "--name", "once"])
    assert made.exit_code == 0, made.output
    first = runner.invoke(cli_app, ["keys", "revoke", "once"])
    assert first.exit_code == 0 and "revoked key_" in first.output, first.output
    second = runner.invoke(cli_app, ["keys", "revoke", "once"])
    assert second.exit_code == 1, second.output
    assert "(once) was already revoked at 20" in " ".join(second.output.split())
    assert not second.output.startswith("revoked")
    shown = runner.invoke(cli_app, ["keys", "show", "once", "--json"])
    assert '"status": "revoked"' in shown.stdout
    missing = runner.invoke(cli_app, ["keys", "revoke", "nobody"])
    assert missing.exit_code == 1 and "nobody" in missing.output
