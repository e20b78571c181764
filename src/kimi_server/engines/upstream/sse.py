"""Incremental server-sent-events parsing: bytes in as they arrive, ``data`` payloads out."""

from __future__ import annotations


class SSEParser:
    """Splits a byte stream into the ``data`` payload of each event.

    Only ``data`` fields matter to a chat stream; ``event``, ``id``, ``retry`` and comments are
    skipped. Multi-line data is joined with newlines, as the SSE specification says.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        if not self._buf and not self._data and chunk.startswith(b"data: ") and chunk.endswith(b"\n\n"):
            # The usual read: exactly one whole one-line event (an upstream sends one per chunk).
            only = chunk[6:-2]
            if b"\n" not in only and not only.endswith(b"\r"):
                return [only]
        # One split per read rather than a find and two slices per line: this runs once per
        # streamed token.
        lines = (self._buf + chunk if self._buf else chunk).split(b"\n")
        self._buf = lines.pop()
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    out.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = self._data = []
                continue
            if line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
        return out

    def pending(self) -> bool:
        """Whether an event was left unfinished when the stream ended."""
        return bool(self._data or self._buf.strip())
