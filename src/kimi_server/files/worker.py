"""The extraction child: ``python -m kimi_server.files.worker PATH EXT MAX_CHARS MAX_PAGES
MEMORY_BYTES CPU_SECONDS``. It limits itself before it reads anything (address space, CPU
seconds, no files written, no core dumps, a lower priority), extracts, and prints one JSON
object: ``{"ok": true, "text", "file_type", "title", "truncated"}`` or ``{"ok": false, "code",
"message"}``. Whatever a hostile file does to a library, it does it here, not in the server.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any


def _limit(memory_bytes: int, cpu_seconds: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))  # SIGXCPU, then SIGKILL
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # writes nothing (stdout is a pipe)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.nice(10)  # the server's own work comes first


def run(argv: list[str]) -> dict[str, Any]:
    path, ext, max_chars, max_pages, memory_bytes, cpu_seconds = argv
    _limit(int(memory_bytes), int(cpu_seconds))
    from kimi_server.files.readers import Refusal, extract

    memory_mb = int(memory_bytes) // (1024 * 1024)
    try:
        got = extract(Path(path), ext, int(max_chars), int(max_pages), int(memory_bytes) // 4)
    except Refusal as refusal:
        return {"ok": False, "code": refusal.code, "message": refusal.message}
    except MemoryError:
        return {
            "ok": False,
            "code": "file_too_complex",
            "message": f"Reading the file needs more memory than this server allows one extraction "
            f"({memory_mb} MiB, files_extract_memory_mb).",
        }
    except RecursionError:
        return {"ok": False, "code": "file_too_complex", "message": "The file nests its parts too deeply to read."}
    except Exception:
        return {"ok": False, "code": "file_unreadable", "message": "The file is damaged or not what it says it is."}
    return {"ok": True, "text": got.text, "file_type": got.file_type, "title": got.title, "truncated": got.truncated}


def main() -> None:
    outcome = run(sys.argv[1:])
    sys.stdout.buffer.write(json.dumps(outcome, ensure_ascii=False).encode("utf-8", "replace"))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
