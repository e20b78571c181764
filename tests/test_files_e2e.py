"""End to end: Kimi's long-document workflow on the real server and the tiny model. A PDF and a
Word document made here are uploaded (the openai SDK, raw HTTP), their text read back and put
in a system message, and the question about them answered with that text in the prompt; a
second key cannot see them. Hostile and fuzzed files are each refused with a 400 while another
key's requests keep being answered."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer
from tests.files_samples import many_pages_pdf, pdf, pdf_bomb, word, word_bomb, word_with_entities, workbook

pytestmark = pytest.mark.e2e

EXTRACT: Any = "file-extract"  # the SDK types purpose as OpenAI's own values; Kimi's pass through
PDF_LINES = ["The lighthouse keeper is named Oskar Lindqvist.", "He paints the lamp room blue every spring."]
DOCX_LINES = ["The ferry to the island leaves at seven.", "Tickets cost twelve euros and are sold on board."]


def sdk(server: LiveServer, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key or server.key, max_retries=0, timeout=600)


def upload(server: LiveServer, name: str, data: bytes, key: str | None = None) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/files",
        files={"file": (name, data, "application/octet-stream")},
        data={"purpose": "file-extract"},
        headers={"Authorization": f"Bearer {key or server.key}"},
        timeout=120,  # a hang guard: the server's own deadline is 30 s
    )


def ask(server: LiveServer, documents: list[str]) -> openai.types.CompletionUsage:
    messages: list[Any] = [{"role": "system", "content": "You are Kimi. Answer from the documents."}]
    messages += [{"role": "system", "content": d} for d in documents]
    messages.append({"role": "user", "content": "What is the lighthouse keeper's name, and when does the ferry leave?"})
    answer = sdk(server).chat.completions.create(
        model="kimi-k3.1-pro", messages=messages, reasoning_effort="low", max_completion_tokens=32
    )
    assert answer.choices[0].message is not None and answer.usage is not None
    return answer.usage


def test_documents_are_read_back_and_answered_from_the_system_message(live_server: LiveServer, tmp_path: Path) -> None:
    path = tmp_path / "lighthouse.pdf"
    path.write_bytes(pdf([PDF_LINES[:1], PDF_LINES[1:]], title="The Lighthouse"))
    made = sdk(live_server).files.create(file=path, purpose=EXTRACT)  # as Kimi's examples do
    pdf_text = sdk(live_server).files.content(file_id=made.id).text  # Kimi's examples send this whole
    assert json.loads(pdf_text)["content"] == "\n\n".join(PDF_LINES)

    sent = upload(live_server, "ferry.docx", word(DOCX_LINES, title="Ferry"))
    assert sent.status_code == 200, sent.text
    docx_id = sent.json()["id"]
    got = httpx.get(
        f"{live_server.base_url}/files/{docx_id}/content", headers={"Authorization": f"Bearer {live_server.key}"}
    )
    docx_text = got.text
    content = json.loads(docx_text)
    assert content["content"].startswith("\n\n".join(DOCX_LINES)) and content["title"] == "Ferry"

    without = ask(live_server, [])
    with_documents = ask(live_server, [pdf_text, docx_text])
    # The documents reached the prompt: it grew by about their size in tokens (the tiny model's
    # answer is not the point; its count of a few hundred characters of English is).
    grew = with_documents.prompt_tokens - without.prompt_tokens
    assert grew >= (len(pdf_text) + len(docx_text)) // 6, (grew, len(pdf_text) + len(docx_text))

    other = sdk(live_server, live_server.other_key)
    for file_id in (made.id, docx_id):
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            other.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            other.files.delete(file_id)
    assert not {made.id, docx_id} & {f.id for f in other.files.list()}
    assert {made.id, docx_id} <= {f.id for f in sdk(live_server).files.list()}
    for file_id in (made.id, docx_id):
        assert sdk(live_server).files.delete(file_id).deleted


class Prober:
    """Another key's requests, one after another, while hostile files are being read: each must
    be answered within 1 s (a generous bound, as a hang guard; nothing here measures speed)."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.stop = threading.Event()
        self.answered = 0
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.server.other_key}"}
        with httpx.Client(timeout=1.0, headers=headers) as client:
            while not self.stop.is_set():
                for path in ("/models", "/files"):
                    try:
                        status = client.get(self.server.base_url + path).status_code
                    except httpx.HTTPError as exc:
                        self.failures.append(f"{path}: {type(exc).__name__}")
                        continue
                    if status != 200:
                        self.failures.append(f"{path}: HTTP {status}")
                    self.answered += 1
                time.sleep(0.05)

    def __enter__(self) -> Prober:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def hostile() -> list[tuple[str, bytes, str]]:
    """(name, bytes, the refusal's code) of each hostile or broken file."""
    return [
        ("random.pdf", random.Random(1).randbytes(50_000), "file_unreadable"),
        ("cut.pdf", pdf([PDF_LINES])[:300], "file_unreadable"),
        ("bomb.pdf", pdf_bomb(100), "file_too_complex"),  # pypdf unpacks no stream past 75 MB
        ("pages.pdf", many_pages_pdf(10_000), "too_many_pages"),
        ("bomb.docx", word_bomb(300), "file_too_complex"),  # past a quarter of files_extract_memory_mb
        ("laughs.docx", word_with_entities(), "file_unreadable"),
        ("book.docx", workbook(), "unsupported_file_type"),
        ("old.doc", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(4000), "unsupported_file_type"),
        ("../../etc/passwd", b"root:x:0:0", "invalid_file_name"),
        ("noise.txt", random.Random(2).randbytes(20_000), "unsupported_file_type"),
    ]


def test_hostile_files_are_refused_while_another_key_is_served(live_server: LiveServer) -> None:
    files = hostile()
    with Prober(live_server) as prober:
        for name, data, code in files:
            r = upload(live_server, name, data)
            assert r.status_code == 400, (name, r.text)
            error = r.json()["error"]
            assert (error["code"], error["param"]) == (code, "file"), (name, error)
            assert "Traceback" not in error["message"] and "/tmp" not in error["message"]
    assert prober.answered > 0 and prober.failures == []
    assert not any(f.filename in {n for n, _, _ in files} for f in sdk(live_server).files.list())


def _mutated(data: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(rng.randint(1, 40)):
        at = rng.randrange(len(out))
        out[at : at + rng.randint(1, 8)] = rng.randbytes(rng.randint(0, 8))
    return bytes(out)


def test_mutated_documents_are_read_or_refused_never_a_server_error(live_server: LiveServer) -> None:
    seeds = {"doc.pdf": pdf([PDF_LINES, DOCX_LINES]), "doc.docx": word(DOCX_LINES)}
    with Prober(live_server) as prober:
        for n in range(8):
            for name, data in seeds.items():
                r = upload(live_server, name, _mutated(data, n))
                assert r.status_code in (200, 400), (name, n, r.text)
                if r.status_code == 400:
                    assert r.json()["error"]["param"] == "file"
                else:
                    sdk(live_server).files.delete(r.json()["id"])
    assert prober.answered > 0 and prober.failures == []
