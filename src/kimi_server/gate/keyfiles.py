"""Secret files (the Responses sealing key, the development API key) must be owner-only."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)


class KeyFileError(ValueError):
    pass


def ensure_private(path: Path) -> None:
    """Makes ``path`` mode 0600 if group or others could read or write it, saying so; refuses
    to go on when that is not possible (the file belongs to someone else, say)."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o077:
        return
    try:
        os.chmod(path, 0o600)
    except OSError as exc:
        raise KeyFileError(
            f"{path} holds a secret key but other users can access it (mode {mode:04o}), and its "
            f"mode could not be changed to 0600 ({exc.strerror}). Run: chmod 600 {path}"
        ) from None
    log.warning(
        "%s holds a secret key but other users could access it (mode %04o); its mode is now 0600. "
        "If others may have read it, replace it.",
        path,
        mode,
    )
