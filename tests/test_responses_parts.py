"""The pieces behind the Responses reasoning item: the extractive summary and the sealing key."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.errors import InvalidRequestError
from kimi_server.serving.sealing import Sealer, load_or_create_key
from kimi_server.serving.summary import ELLIPSIS, Summarizer
from tests.responses_util import body


def summarize(text: str, limit: int, *, step: int = 3) -> tuple[str, str]:
    """(summary, the text released while streaming) for ``text`` fed in small pieces."""
    s = Summarizer(limit)
    streamed = "".join(s.feed(text[i : i + step]) for i in range(0, len(text), step))
    streamed += s.finish()
    return s.summary, streamed


def test_summary_is_the_leading_sentences_within_the_bound() -> None:
    text = "  First we add. Then we carry the one! Finally we check the total twice over."
    summary, streamed = summarize(text, 40)
    assert summary == "First we add. Then we carry the one!"
    assert streamed == summary  # what streamed is exactly the summary


def test_short_reasoning_is_its_own_summary() -> None:
    assert summarize("Just this, no full stop", 100)[0] == "Just this, no full stop"


def test_without_a_sentence_end_it_cuts_at_a_word() -> None:
    summary, streamed = summarize("word " * 40, 50)
    assert summary.endswith(ELLIPSIS) and len(summary) <= 51
    assert not summary[:-1].endswith(" ") and streamed == summary


def test_cjk_sentence_ends_count() -> None:
    assert summarize("\u5148\u52a0\u3002\u518d\u6570\u4e00\u904d\u3002\u6700\u540e", 4)[0] == ("\u5148\u52a0\u3002")


def test_empty_reasoning_has_empty_summary() -> None:
    assert summarize("   ", 10) == ("", "")


def test_summary_setting_sets_the_length(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = Script(reasoning=tuple(f"Step {i} is checked with care. " for i in range(60)))
    lengths = {}
    for mode in ("concise", "detailed"):
        r = client.post("/v1/responses", json=body(reasoning={"effort": "low", "summary": mode}))
        text = r.json()["output"][0]["summary"][0]["text"]
        assert text.endswith(".") and text.startswith("Step 0")
        lengths[mode] = len(text)
    assert lengths["concise"] <= 280 < lengths["detailed"] <= 1200


def test_key_file_is_made_owner_only_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "d" / "responses.key"
    key = load_or_create_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(path) == key and len(key) == 32
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_malformed_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "responses.key"
    path.write_text("c2hvcnQ=\n")
    with pytest.raises(ValueError, match="32"):
        load_or_create_key(path)


def test_seal_binds_the_key_id(tmp_path: Path) -> None:
    sealer = Sealer(load_or_create_key(tmp_path / "k"))
    blob = sealer.seal("secret thoughts", key_id="a")
    assert "secret" not in blob
    assert sealer.open(blob, key_id="a", param="p") == "secret thoughts"
    with pytest.raises(InvalidRequestError) as caught:
        sealer.open(blob, key_id="b", param="input[0].encrypted_content")
    assert caught.value.param == "input[0].encrypted_content"
