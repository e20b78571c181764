"""Image and video input: valid files reach a vision-capable engine intact; hostile or broken
ones, and URLs the server must not fetch, are refused with a 400 naming the part, and a
loopback canary listener sees no connection."""

from __future__ import annotations

import asyncio
import base64
import datetime
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.errors import InvalidRequestError
from kimi_server.media.checks import video_frames
from kimi_server.media.fetch import Fetcher
from tests.conftest import ScriptedApp
from tests.media_samples import data_url, image, mp4, png_bomb

CHAT = "/v1/chat/completions"


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine(images=True)  # a vision-capable engine that records what it got


@pytest.fixture
def client(engine: ScriptedEngine, scripted_app: ScriptedApp) -> Iterator[TestClient]:
    with scripted_app(engine, media_max_video_seconds=5, media_max_image_bytes=200_000) as c:
        yield c


def chat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is this?"}, *parts]
    return {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": content}]}


def image_part(url: str, short: bool = False) -> dict[str, Any]:
    return {"type": "image_url", "image_url": url if short else {"url": url}}


def refused(r: Any, param: str, *words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err


@pytest.mark.parametrize(("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_images_reach_the_engine_intact(client: TestClient, engine: ScriptedEngine, fmt: str, mime: str) -> None:
    data = image(fmt)
    r = client.post(CHAT, json=chat([image_part(data_url(mime, data), short=fmt == "JPEG")]))
    assert r.status_code == 200, r.text
    [seen] = engine.requests[-1].messages[0].images
    assert seen.startswith(f"data:{mime};base64,") and base64.b64decode(seen.split(",", 1)[1]) == data


def test_video_reaches_the_engine_intact(client: TestClient, engine: ScriptedEngine) -> None:
    data = mp4()
    r = client.post(CHAT, json=chat([{"type": "video_url", "video_url": {"url": data_url("video/mp4", data)}}]))
    assert r.status_code == 200, r.text
    [seen] = engine.requests[-1].messages[0].videos
    assert base64.b64decode(seen.split(",", 1)[1]) == data
    frames = video_frames(data, count=3)  # for upstreams that take only images
    assert len(frames) == 3 and all(f.startswith("data:image/png;base64,") for f in frames)


def test_responses_input_image(client: TestClient, engine: ScriptedEngine) -> None:
    data = image("PNG")
    item: dict[str, Any] = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What?"},
            {"type": "input_image", "image_url": data_url("image/png", data)},
        ],
    }
    body = {"model": "kimi-k3.1-pro", "input": [item]}
    assert client.post("/v1/responses", json=body).status_code == 200
    [seen] = engine.requests[-1].messages[0].images
    assert base64.b64decode(seen.split(",", 1)[1]) == data
    item["content"][1]["image_url"] = data_url("image/png", image("JPEG"))
    refused(client.post("/v1/responses", json=body), "input[0].content[1]", "image/jpeg")


def test_hostile_and_broken_files_refused(client: TestClient) -> None:
    at = "messages[0].content[1]"
    refused(client.post(CHAT, json=chat([image_part(data_url("image/png", png_bomb()))])), at, "pixels")
    jpeg = image("JPEG", (64, 64))
    truncated = jpeg[: len(jpeg) // 2]
    refused(client.post(CHAT, json=chat([image_part(data_url("image/jpeg", truncated))])), at, "corrupt")
    refused(client.post(CHAT, json=chat([image_part(data_url("image/png", jpeg))])), at, "image/png", "image/jpeg")
    big = image("PNG", (400, 400)) + b"\0" * 200_000
    refused(client.post(CHAT, json=chat([image_part(data_url("image/png", big))])), at, "larger")
    refused(client.post(CHAT, json=chat([image_part("data:image/png;base64,%%%")])), at, "base64")
    refused(client.post(CHAT, json=chat([image_part(data_url("image/png", b"hello"))])), at, "not a supported")
    long_video = {"type": "video_url", "video_url": data_url("video/mp4", mp4(seconds=8, fps=2))}
    refused(client.post(CHAT, json=chat([long_video])), at, "longer")
    cut = mp4()
    broken = {"type": "video_url", "video_url": data_url("video/mp4", cut[: len(cut) // 3])}
    refused(client.post(CHAT, json=chat([broken])), at)


def test_text_model_refuses_images(scripted_app: ScriptedApp) -> None:
    with scripted_app(ScriptedEngine(images=False)) as c:
        r = c.post(CHAT, json=chat([image_part(data_url("image/png", image("PNG")))]))
    refused(r, "messages[0].content[1]", "cannot see images", "is an image_url part")
    with scripted_app(ScriptedEngine(images=False)) as c:
        r = c.post(CHAT, json=chat([{"type": "video_url", "video_url": data_url("video/mp4", mp4())}]))
    refused(r, "messages[0].content[1]", "cannot see videos", "is a video_url part")


# --- URLs -------------------------------------------------------------------------------------


@pytest.fixture
def canary() -> Iterator[socket.socket]:
    """A loopback listener no request may reach."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def assert_untouched(sock: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        sock.accept()


def test_private_urls_refused(engine: ScriptedEngine, scripted_app: ScriptedApp, canary: socket.socket) -> None:
    port = canary.getsockname()[1]
    at = "messages[0].content[1]"
    # Even with the hosts allowed, loopback and link-local addresses are never fetched.
    allowed = ["127.0.0.1", "localhost", "169.254.169.254", "[::1]"]
    with scripted_app(engine) as strict, scripted_app(engine, media_allowed_hosts=allowed) as lax:
        for c in (strict, lax):
            for url in (
                f"http://127.0.0.1:{port}/a.png",
                f"http://localhost:{port}/a.png",
                "http://169.254.169.254/latest/meta-data/",
                f"http://[::1]:{port}/a.png",
            ):
                r = c.post(CHAT, json=chat([image_part(url)]))
                refused(r, at)
                assert r.json()["error"]["code"] == "media_fetch_refused", r.text
        refused(strict.post(CHAT, json=chat([image_part("file:///etc/passwd")])), at)
    assert_untouched(canary)


class _Media(BaseHTTPRequestHandler):
    target = ""
    png = b""

    def do_GET(self) -> None:
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.target)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.png)))
        self.end_headers()
        self.wfile.write(self.png)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def media_host() -> Iterator[int]:
    """A media server on 127.0.0.2, which the tests below treat as a public address."""
    server = ThreadingHTTPServer(("127.0.0.2", 0), _Media)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Media.png = image("PNG")
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_allowed_host_fetch_and_redirects(
    engine: ScriptedEngine, scripted_app: ScriptedApp, canary: socket.socket, media_host: int
) -> None:
    canary_port = canary.getsockname()[1]
    answers: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        return [answers.pop(0) if answers else "127.0.0.2"] if host == "media.test" else ["127.0.0.1"]

    with scripted_app(engine, media_allowed_hosts=["media.test"]) as c:
        assert isinstance(c.app, FastAPI)
        fetcher = c.app.state.kimi.media.fetcher
        fetcher.resolve = resolve
        fetcher.address_ok = lambda a: a == "127.0.0.2"  # the test's stand-in for "public"
        url = f"http://media.test:{media_host}/pic.png"
        assert c.post(CHAT, json=chat([image_part(url)])).status_code == 200
        [seen] = engine.requests[-1].messages[0].images
        assert base64.b64decode(seen.split(",", 1)[1]) == _Media.png
        # A redirect to a private address, by name (DNS now answers loopback) or by address.
        _Media.target = f"http://media.test:{canary_port}/x.png"
        answers[:] = ["127.0.0.2", "127.0.0.1"]
        r = c.post(CHAT, json=chat([image_part(f"http://media.test:{media_host}/redirect")]))
        refused(r, "messages[0].content[1]", "private")
        _Media.target = f"http://127.0.0.1:{canary_port}/x.png"
        r = c.post(CHAT, json=chat([image_part(f"http://media.test:{media_host}/redirect")]))
        refused(r, "messages[0].content[1]", "another host")
        refused(
            c.post(CHAT, json=chat([image_part(f"http://other.test:{media_host}/a.png")])),
            "messages[0].content[1]",
            "not allowed",
        )
    assert_untouched(canary)


# --- the fetcher itself: httpx over a connection to the checked address ------------------------


class _Hostile(BaseHTTPRequestHandler):
    """Bodies a fetch must stop reading: larger than declared, declared too large, trickled."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.seen_hosts.append(self.headers.get("Host", ""))  # type: ignore[attr-defined]
        if self.path == "/chunked-big":  # no Content-Length: the cap must hold while reading
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(64):
                self.wfile.write(b"4000\r\n" + b"\0" * 0x4000 + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/declared-big":
            self.send_response(200)
            self.send_header("Content-Length", str(10**9))
            self.end_headers()
            self.wfile.write(b"\0" * 100)
        elif self.path == "/trickle":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                self.wfile.write(b"\0")
                self.wfile.flush()
                threading.Event().wait(0.05)
        else:
            body = _Media.png
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # a fetch that stops reading resets the connection: expected here


@pytest.fixture
def hostile() -> Iterator[ThreadingHTTPServer]:
    server = _QuietServer(("127.0.0.2", 0), _Hostile)
    server.seen_hosts = []  # type: ignore[attr-defined]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Media.png = image("PNG")
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


async def _to_media_test(host: str, port: int) -> list[str]:
    return ["127.0.0.2"] if host == "media.test" else ["127.0.0.1"]


def _fetcher(timeout_s: float = 2.0, **kw: Any) -> Fetcher:
    kw.setdefault("address_ok", lambda a: a == "127.0.0.2")
    return Fetcher(["media.test"], timeout_s, resolve=_to_media_test, **kw)


def _fails(fetcher: Fetcher, url: str, code: str, *words: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        asyncio.run(fetcher.fetch(url, "messages[0].content[1]", 200_000))
    assert caught.value.code == code and caught.value.param == "messages[0].content[1]", caught.value.message
    for word in words:
        assert word in caught.value.message


def test_fetch_reads_within_the_caps_from_the_checked_address(
    hostile: ThreadingHTTPServer, canary: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = hostile.server_address[1]
    # A proxy in the environment is not used: it would connect to a name resolved elsewhere.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{canary.getsockname()[1]}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{canary.getsockname()[1]}")
    # media.test has no DNS entry here: only the checked address can have been connected to.
    got = asyncio.run(_fetcher().fetch(f"http://media.test:{port}/pic.png", "x", 200_000))
    assert got == _Media.png and hostile.seen_hosts[-1] == f"media.test:{port}"  # type: ignore[attr-defined]
    _fails(_fetcher(), f"http://media.test:{port}/chunked-big", "media_too_large", "larger than 200000")
    _fails(_fetcher(), f"http://media.test:{port}/declared-big", "media_too_large")
    _fails(_fetcher(timeout_s=0.5), f"http://media.test:{port}/trickle", "media_fetch_failed", "longer than 0.5 s")
    # The peer is checked again on the connection itself (here: the rule says no the second time).
    verdicts = iter([True, False])
    strict = _fetcher(address_ok=lambda a: next(verdicts))
    _fails(strict, f"http://media.test:{port}/pic.png", "media_fetch_refused", "private")
    assert_untouched(canary)


def test_fetch_over_tls_checks_the_certificate_against_the_host_name(tmp_path: Path) -> None:
    """Connected to the checked address, TLS still names the host (SNI) and verifies its
    certificate for that name, not for the address."""
    cert, key = _self_signed(tmp_path, "media.test")
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)
    server = _QuietServer(("127.0.0.2", 0), _Hostile)
    server.seen_hosts = []  # type: ignore[attr-defined]
    server.socket = served.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Media.png = image("PNG")
    try:
        port = server.server_address[1]
        trusting = ssl.create_default_context(cafile=str(cert))
        got = asyncio.run(_fetcher(tls=trusting).fetch(f"https://media.test:{port}/pic.png", "x", 200_000))
        assert got == _Media.png
        other = Fetcher(["*.test"], 2.0, resolve=_to_address, address_ok=lambda a: a == "127.0.0.2", tls=trusting)
        _fails(other, f"https://wrong.test:{port}/pic.png", "media_fetch_failed")  # not the certificate's name
        _fails(_fetcher(), f"https://media.test:{port}/pic.png", "media_fetch_failed")  # an untrusted issuer
    finally:
        server.shutdown()
        server.server_close()


async def _to_address(host: str, port: int) -> list[str]:
    return ["127.0.0.2"]


def _self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path
