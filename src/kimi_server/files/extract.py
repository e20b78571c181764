"""Runs the extraction child (``files/worker.py``) for one stored upload, off the event loop:
a few at once per server process, each with a wall-clock deadline on top of the limits the
child sets itself, and killed when it passes it. Whatever happens in the child comes back as
the text or as a 400 that says why; a server error never."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimi_server.errors import EngineUnavailableError, InvalidRequestError
from kimi_server.files.limits import FileLimits

WORKER = (sys.executable, "-m", "kimi_server.files.worker")
_CODES = frozenset({"file_unreadable", "unsupported_file_type", "encrypted_file", "too_many_pages", "file_too_complex"})
_EXT = re.compile(r"\.([A-Za-z0-9]{1,10})$")


@dataclass(frozen=True)
class ExtractedText:
    text: str
    file_type: str
    title: str
    truncated: bool


def extension(filename: str) -> str:
    """The name's extension, lower case, as a hint between HTML, Markdown and plain text."""
    match = _EXT.search(filename)
    return match.group(1).lower() if match else ""


class Extractor:
    def __init__(self, limits: FileLimits, command: Sequence[str] = WORKER) -> None:
        self.limits = limits
        self.command = tuple(command)
        self._slots = asyncio.Semaphore(limits.extract_concurrency)

    async def extract(self, path: Path, filename: str) -> ExtractedText:
        limits = self.limits
        try:
            async with asyncio.timeout(limits.extract_timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise EngineUnavailableError(
                "The server is busy extracting other files; try again shortly.",
                code="extraction_busy",
                retry_after=math.ceil(limits.extract_timeout_s),
            ) from None
        try:
            outcome = await self._run(path, extension(filename))
        finally:
            self._slots.release()
        return _result(outcome, limits.extract_timeout_s)

    async def _run(self, path: Path, ext: str) -> dict[str, Any] | str:
        """The child's JSON answer, or why there is none ("timeout", "crashed")."""
        limits = self.limits
        args = [str(path), ext, str(limits.max_chars), str(limits.max_pages)]
        args += [str(limits.extract_memory_bytes), str(math.ceil(limits.extract_timeout_s))]
        proc = await asyncio.create_subprocess_exec(
            *self.command,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        # The text is at most max_chars characters: 4 bytes each in UTF-8, room for JSON escapes.
        cap = limits.max_chars * 8 + 65536
        try:
            async with asyncio.timeout(limits.extract_timeout_s):
                out, code = await _output(proc, cap)
        except TimeoutError:
            return "timeout"
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if code in (-signal.SIGXCPU, -signal.SIGKILL):
            return "timeout"  # its CPU limit
        try:
            parsed = json.loads(out)
        except ValueError:
            return "crashed"
        return parsed if isinstance(parsed, dict) else "crashed"


async def _output(proc: asyncio.subprocess.Process, cap: int) -> tuple[bytes, int]:
    """What the child printed (nothing if it printed more than ``cap`` bytes) and its exit status."""
    assert proc.stdout is not None
    chunks: list[bytes] = []
    size = 0
    while chunk := await proc.stdout.read(65536):
        size += len(chunk)
        if size > cap:  # more than the child may ever say: treated as a crash
            proc.kill()
            await proc.wait()
            return b"", 0
        chunks.append(chunk)
    return b"".join(chunks), await proc.wait()


def _result(outcome: dict[str, Any] | str, timeout_s: float) -> ExtractedText:
    if outcome == "timeout":
        raise InvalidRequestError(
            f"Extracting the file's text took longer than {timeout_s:g} s (files_extract_timeout_s): "
            "it may be damaged, or built to be slow to read.",
            param="file",
            code="extraction_timeout",
        )
    if isinstance(outcome, dict) and outcome.get("ok") is True:
        return ExtractedText(
            text=str(outcome.get("text", "")),
            file_type=str(outcome.get("file_type", "text/plain")),
            title=str(outcome.get("title", "")),
            truncated=bool(outcome.get("truncated", False)),
        )
    if isinstance(outcome, dict) and outcome.get("code") in _CODES and isinstance(outcome.get("message"), str):
        raise InvalidRequestError(str(outcome["message"]), param="file", code=str(outcome["code"]))
    raise InvalidRequestError(
        "The file could not be read within this server's limits for extraction (memory, time).",
        param="file",
        code="file_unreadable",
    )
