"""Checks one image or video before anything else sees it.

The type is sniffed from the bytes (the ``data:`` URL's own claim must agree); size, pixel
count and duration are bounded before full decoding (a decompression bomb is refused from its
header); the whole file is then decoded, so truncated or corrupt data is refused too. Pillow
decodes images, PyAV (FFmpeg, bundled in its wheels) videos.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from dataclasses import dataclass
from typing import Literal

from kimi_server.errors import InvalidRequestError

Kind = Literal["image", "video"]
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
VIDEO_TYPES = ("video/mp4", "video/webm", "video/quicktime")
_DATA_URL = re.compile(r"^data:([a-zA-Z0-9.+/-]+)?((?:;[a-zA-Z0-9=._+-]+)*);base64,", re.ASCII)


@dataclass(frozen=True)
class MediaLimits:
    max_image_bytes: int
    max_image_pixels: int
    max_video_bytes: int
    max_video_seconds: float


@dataclass(frozen=True)
class CheckedMedia:
    kind: Kind
    mime: str
    data: bytes

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def refuse(where: str, why: str, code: str = "invalid_media") -> InvalidRequestError:
    return InvalidRequestError(f"'{where}': {why}", param=where, code=code)


def sniff(data: bytes) -> str | None:
    """The media type the bytes themselves show, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[4:8] == b"ftyp":
        return "video/quicktime" if data[8:10] == b"qt" else "video/mp4"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "video/webm"
    return None


def decode_data_url(url: str, where: str, max_bytes: int) -> tuple[str | None, bytes]:
    """(the declared type, the bytes) of a base64 ``data:`` URL."""
    match = _DATA_URL.match(url)
    if match is None:
        raise refuse(where, "a data URL must be 'data:<type>;base64,<data>'.")
    payload = url[match.end() :]
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise refuse(where, f"the file is larger than {max_bytes} bytes.", "media_too_large")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise refuse(where, "the data URL's base64 data is not valid.") from None
    declared = match.group(1).lower() if match.group(1) else None
    return declared, data


def check_bytes(data: bytes, declared: str | None, kind: Kind, where: str, limits: MediaLimits) -> CheckedMedia:
    actual = sniff(data)
    allowed = IMAGE_TYPES if kind == "image" else VIDEO_TYPES
    if actual is None or actual not in allowed:
        names = ", ".join(t.split("/")[1].upper() for t in allowed)
        raise refuse(where, f"the data is not a supported {kind} ({names}).", "unsupported_media")
    if declared is not None and declared != actual and not (declared == "image/jpg" and actual == "image/jpeg"):
        raise refuse(where, f"the data URL says {declared}, but the data is {actual}.", "media_type_mismatch")
    limit = limits.max_image_bytes if kind == "image" else limits.max_video_bytes
    if len(data) > limit:
        raise refuse(where, f"the file is larger than {limit} bytes.", "media_too_large")
    if kind == "image":
        _check_image(data, where, limits)
    else:
        _check_video(data, where, limits)
    return CheckedMedia(kind, actual, data)


def _check_image(data: bytes, where: str, limits: MediaLimits) -> None:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size  # from the header: nothing decoded yet
                if width * height > limits.max_image_pixels:
                    raise refuse(
                        where,
                        f"the image is {width}x{height} pixels, more than the {limits.max_image_pixels} allowed.",
                        "media_too_large",
                    )
                img.load()  # decodes everything: truncated or corrupt data fails here
    except InvalidRequestError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise refuse(where, "the image has too many pixels.", "media_too_large") from None
    except Exception:
        raise refuse(where, "the image data is corrupt or truncated.") from None


def _check_video(data: bytes, where: str, limits: MediaLimits) -> None:
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            streams = container.streams.video
            if not streams:
                raise refuse(where, "the file holds no video stream.")
            stream = streams[0]
            seconds = _duration(container.duration, stream)
            if seconds is None or seconds > limits.max_video_seconds:
                raise refuse(
                    where,
                    f"the video is longer than {limits.max_video_seconds:g} seconds"
                    if seconds
                    else "the video's duration is unknown.",
                    "media_too_large",
                )
            width, height = stream.codec_context.width, stream.codec_context.height
            if width * height > limits.max_image_pixels:
                raise refuse(where, "the video's frames have too many pixels.", "media_too_large")
            if next(iter(container.decode(stream)), None) is None:
                raise refuse(where, "the video has no decodable frame.")
            # Read every packet to the end (cheap, no decoding): a cut-off file fails here.
            for _ in container.demux(stream):
                pass
    except InvalidRequestError:
        raise
    except Exception:
        raise refuse(where, "the video data is corrupt or truncated.") from None


def _duration(container_us: int | None, stream: object) -> float | None:
    if container_us:
        return container_us / 1_000_000
    duration = getattr(stream, "duration", None)
    base = getattr(stream, "time_base", None)
    if duration and base:
        return float(duration * base)
    return None


def video_frames(data: bytes, count: int = 4, max_side: int = 768) -> list[str]:
    """Up to ``count`` frames spread over a checked video, as PNG data URLs: what an upstream
    that takes only images receives instead of the video."""
    import av

    out: list[str] = []
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        total = stream.frames or 0
        step = max(1, total // count) if total else 1
        for n, frame in enumerate(container.decode(stream)):
            if n % step:
                continue
            img = frame.to_image()  # type: ignore[no-untyped-call]
            img.thumbnail((max_side, max_side))
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            out.append(CheckedMedia("image", "image/png", buf.getvalue()).data_url())
            if len(out) >= count:
                break
    return out
