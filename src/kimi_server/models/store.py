"""The local model store: a cache directory of GGUF files, each with a small JSON sidecar.

Files are written atomically (temp file in the same directory, fsync, rename) and the sidecar is
written only after the rename, so a killed or failed download never leaves anything that
``path_for`` returns. The sidecar records the sha256 that was checked, so listing the store does
not rehash hundreds of megabytes each time; it is trusted only while the file's size and mtime
still match it.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from .registry import get_source, name_for_filename

GGUF_MAGIC = b"GGUF"
HF_PREFIX = "hf:"
HF_SUBDIR = "hf"  # hf:ORG/REPO/FILE is stored at <root>/hf/ORG/REPO/FILE
PARTIAL_SUFFIX = ".partial"
SIDECAR_SUFFIX = ".json"
WORKDIR_PREFIX = ".work-"
STALE_AFTER_S = 30 * 60  # a partial untouched this long belongs to a dead process
CHUNK_BYTES = 1 << 20


class ModelPullError(Exception):
    """A model could not be fetched, verified or found. The message is written for the user."""


def default_models_dir() -> Path:
    """``$KIMI_MODELS_DIR``, else ``$XDG_CACHE_HOME/kimi-server/models``, else ``~/.cache/...``."""
    explicit = os.environ.get("KIMI_MODELS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "kimi-server" / "models"


@dataclass(frozen=True)
class LocalModel:
    """A GGUF file found in the store."""

    name: str  # catalogue name, ``hf:ORG/REPO/FILE``, or the path relative to the store root
    path: Path
    size: int
    verified: bool  # its sha256 was checked against a pin when it was written


@dataclass(frozen=True)
class _Record:
    """The sidecar's content."""

    sha256: str
    size: int
    mtime_ns: int
    verified: bool
    origin: str


class HashingWriter:
    """Writes to a file while hashing and counting; refuses to grow past the expected size."""

    def __init__(self, raw: BinaryIO, limit: int | None) -> None:
        self._raw = raw
        self._limit = limit
        self._hash = hashlib.sha256()
        self.written = 0

    def write(self, data: bytes) -> int:
        if self._limit is not None and self.written + len(data) > self._limit:
            raise ModelPullError(f"received more than the expected {self._limit:,} bytes")
        self._raw.write(data)
        self._hash.update(data)
        self.written += len(data)
        return len(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class ModelStore:
    """The model cache directory. It is created on first write, not on construction."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root if root is not None else default_models_dir()).expanduser()

    def file_for(self, name: str) -> Path:
        """Where the GGUF for ``name`` lives (or would live) in this store."""
        source = get_source(name)
        if source is not None:
            return self.root / source.filename
        if name.startswith(HF_PREFIX):
            return self._inside(f"{HF_SUBDIR}/{name.removeprefix(HF_PREFIX)}")
        return self._inside(name)

    def path_for(self, name: str) -> Path | None:
        """The GGUF for ``name`` if this store wrote it completely (and verified it, if pinned)."""
        try:
            path = self.file_for(name)
        except ModelPullError:
            return None
        record = _read_valid_record(path)
        if record is None or not _satisfies_pin(name, record):
            return None
        return path

    def list(self) -> builtins.list[LocalModel]:
        """Every GGUF file under the root (partial downloads excluded)."""
        if not self.root.is_dir():
            return []
        paths = sorted(p for p in self.root.rglob("*.gguf") if p.is_file() and not self._hidden(p))
        return [self._describe(path) for path in paths]

    @contextlib.contextmanager
    def writer(
        self, name: str, *, size: int | None = None, sha256: str | None = None, origin: str = ""
    ) -> Iterator[HashingWriter]:
        """Yield a writer for ``name``'s GGUF; the file appears only if the block succeeds and
        the bytes match ``size`` and ``sha256`` (when given). Otherwise the temp file is removed.
        """
        target = self.file_for(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Not mkstemp: its 0600 mode would stick to the model; 0666 lets the umask decide.
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as raw:
                out = HashingWriter(raw, limit=size)
                yield out
                raw.flush()
                os.fsync(raw.fileno())
            digest = _check_written(out, size, sha256, target.name)
            _commit(tmp, target, verified=sha256 is not None, sha256=digest, origin=origin)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def link(self, name: str, source: Path, *, sha256: str | None = None, origin: str = "") -> Path:
        """Record ``source`` (a file another cache owns, such as Hugging Face's) as ``name``'s GGUF:
        a symbolic link to it, or a copy where links cannot be made. Kept only if it hashes to
        ``sha256`` (when given); returns its path in the store."""
        target = self.file_for(name)
        digest = _hash_file(source)
        if sha256 is not None and digest != sha256.lower():
            raise ModelPullError(f"{target.name}: sha256 {digest} does not match the expected {sha256}; not saved")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")
        try:
            try:
                tmp.symlink_to(source.resolve())
            except OSError:  # no links on this file system: a copy of its own
                shutil.copyfile(source, tmp)
            _commit(tmp, target, verified=sha256 is not None, sha256=digest, origin=origin)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return target

    def adopt(self, name: str, *, size: int, sha256: str, origin: str = "") -> Path | None:
        """Record an unrecorded file already in place (copied by hand, or left by a crash between
        rename and sidecar) if it hashes to the pin; return it, else None."""
        path = self.file_for(name)
        if not path.is_file() or path.stat().st_size != size:
            return None
        if _hash_file(path) != sha256:
            return None
        _write_record(path, verified=True, sha256=sha256, origin=origin)
        return path

    @contextlib.contextmanager
    def workdir(self) -> Iterator[Path]:
        """A scratch directory inside the store (same disk as the result), removed afterwards."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root, prefix=WORKDIR_PREFIX) as folder:
            yield Path(folder)

    def remove_stale_partials(self, max_age_s: float = STALE_AFTER_S) -> None:
        """Delete leftovers of killed downloads; fresh ones may belong to a running pull."""
        if not self.root.is_dir():
            return
        cutoff = time.time() - max_age_s
        leftovers = [*self.root.rglob(f"*{PARTIAL_SUFFIX}"), *self.root.glob(f"{WORKDIR_PREFIX}*")]
        for path in leftovers:
            with contextlib.suppress(OSError):
                if path.lstat().st_mtime < cutoff:  # lstat: a partial link whose target is gone
                    _remove(path)

    def _inside(self, relative: str) -> Path:
        rel = PurePosixPath(relative)
        if rel.is_absolute() or ".." in rel.parts or rel.suffix.lower() != ".gguf":
            raise ModelPullError(f"not a model file name inside the store: {relative!r}")
        return self.root.joinpath(*rel.parts)

    def _hidden(self, path: Path) -> bool:
        # Partials and scratch directories are dot-named.
        return any(part.startswith(".") for part in path.relative_to(self.root).parts)

    def _name_of(self, path: Path) -> str:
        rel = path.relative_to(self.root).as_posix()
        catalogue_name = name_for_filename(rel)
        if catalogue_name is not None:
            return catalogue_name
        if rel.startswith(f"{HF_SUBDIR}/"):
            return HF_PREFIX + rel.removeprefix(f"{HF_SUBDIR}/")
        return rel

    def _describe(self, path: Path) -> LocalModel:
        name = self._name_of(path)
        record = _read_valid_record(path)
        verified = record is not None and record.verified and _satisfies_pin(name, record)
        return LocalModel(name=name, path=path, size=path.stat().st_size, verified=verified)


@contextlib.contextmanager
def transfer_progress(console: Console, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A bytes / speed / ETA bar; yields the function that advances it."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def _satisfies_pin(name: str, record: _Record) -> bool:
    source = get_source(name)
    if source is None:
        return True
    return record.verified and record.sha256 == source.sha256 and record.size == source.size_bytes


def _check_written(out: HashingWriter, size: int | None, sha256: str | None, label: str) -> str:
    digest = out.hexdigest()
    if size is not None and out.written != size:
        raise ModelPullError(f"{label}: got {out.written:,} bytes, expected {size:,}; not saved")
    if sha256 is not None and digest != sha256.lower():
        raise ModelPullError(f"{label}: sha256 {digest} does not match the expected {sha256}; not saved")
    return digest


def _commit(tmp: Path, target: Path, *, verified: bool, sha256: str, origin: str) -> None:
    # Drop the old sidecar first, so it can never vouch for the new bytes (or the old ones).
    _sidecar(target).unlink(missing_ok=True)
    os.replace(tmp, target)
    _fsync_dir(target.parent)
    _write_record(target, verified=verified, sha256=sha256, origin=origin)


def _write_record(path: Path, *, verified: bool, sha256: str, origin: str) -> None:
    stat = path.stat()
    record = _Record(sha256, stat.st_size, stat.st_mtime_ns, verified, origin)
    sidecar = _sidecar(path)
    tmp = sidecar.with_name(f".{sidecar.name}{PARTIAL_SUFFIX}")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, sidecar)
    _fsync_dir(path.parent)


def _read_valid_record(path: Path) -> _Record | None:
    """The sidecar's record, if there is one and it still describes the file on disk."""
    try:
        stat = path.stat()
        data = json.loads(_sidecar(path).read_text(encoding="utf-8"))
        record = _Record(**data)
    except (OSError, ValueError, TypeError):
        return None
    if (record.size, record.mtime_ns) != (stat.st_size, stat.st_mtime_ns):
        return None
    return record


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
