"""Small media files made on the spot (Pillow, PyAV), and hostile ones made by hand."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def image(fmt: str, size: tuple[int, int] = (32, 24)) -> bytes:
    img = Image.new("RGB", size, (200, 40, 90))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def mp4(seconds: float = 1.0, fps: int = 10) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for n in range(int(seconds * fps)):
            image = Image.new("RGB", (64, 48), (n * 8 % 255, 90, 30))
            frame = av.VideoFrame.from_image(image)  # type: ignore[no-untyped-call]  # PyAV leaves it untyped
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def png_bomb(side: int = 100_000) -> bytes:
    """A PNG whose header claims side x side pixels; its few bytes of data inflate to far more."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (side + 1) * 16, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
