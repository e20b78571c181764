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
        self._buf += chunk
        out: list[bytes] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return out
            line = self._buf[:nl]
            self._buf = self._buf[nl + 1 :]
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    out.append(b"\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)

    def pending(self) -> bool:
        """Whether an event was left unfinished when the stream ended."""
        return bool(self._data or self._buf.strip())
