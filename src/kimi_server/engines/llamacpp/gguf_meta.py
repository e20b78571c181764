"""Reads the few metadata keys we need from a GGUF file header (no tensors are touched).

Format (little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64 key/value count, then
key/value pairs: a u64-length UTF-8 key, a u32 value type, the value. Arrays carry an element type
and a u64 count. We keep scalars and strings, skip arrays except those asked for: the token list,
which spells the BOS/EOS tokens that chat templates use, and the tokenizer's arrays (tokenizer.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    pass


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    name: str
    chat_template: str | None
    bos_token: str
    eos_token: str
    context_length: int | None
    kv_bytes_per_token: int | None = None  # f16 K and V over all layers; None when unknown


def _read(f: BinaryIO, fmt: str) -> object:
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise GGUFError("truncated GGUF header")
    return struct.unpack(fmt, raw)[0]


def _read_str(f: BinaryIO) -> str:
    length = int(_read(f, "<Q"))  # type: ignore[call-overload]
    if length > 64 * 1024 * 1024:
        raise GGUFError("implausible string length in GGUF header")
    return f.read(length).decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, vtype: int, keep_array: bool) -> object:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _read_str(f)
    if vtype == _ARRAY:
        etype = int(_read(f, "<I"))  # type: ignore[call-overload]
        count = int(_read(f, "<Q"))  # type: ignore[call-overload]
        if etype in _SCALARS and not keep_array:
            f.seek(struct.calcsize(_SCALARS[etype]) * count, 1)
            return None
        items = [_read_value(f, etype, keep_array) for _ in range(count)]
        return items if keep_array else None
    raise GGUFError(f"unknown GGUF value type {vtype}")


def read_gguf_meta(path: Path, arrays: frozenset[str] = frozenset()) -> dict[str, object]:
    """Every scalar and string of the header, plus the arrays named in ``arrays``."""
    meta: dict[str, object] = {}
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path.name} is not a GGUF file")
        version = int(_read(f, "<I"))  # type: ignore[call-overload]
        if version < 2:
            raise GGUFError(f"GGUF version {version} is not supported")
        _read(f, "<Q")
        n_kv = int(_read(f, "<Q"))  # type: ignore[call-overload]
        for _ in range(n_kv):
            key = _read_str(f)
            vtype = int(_read(f, "<I"))  # type: ignore[call-overload]
            meta[key] = _read_value(f, vtype, keep_array=key in arrays)
    return meta


def read_gguf_info(path: Path) -> GGUFInfo:
    meta = read_gguf_meta(path, frozenset({"tokenizer.ggml.tokens"}))
    arch = str(meta.get("general.architecture", "unknown"))
    tokens = meta.get("tokenizer.ggml.tokens")
    token_list = tokens if isinstance(tokens, list) else []

    def token(key: str) -> str:
        idx = meta.get(key)
        if isinstance(idx, int) and 0 <= idx < len(token_list):
            return str(token_list[idx])
        return ""

    template = meta.get("tokenizer.chat_template")
    ctx = meta.get(f"{arch}.context_length")
    kv_bytes = _kv_bytes_per_token(meta, arch)
    return GGUFInfo(
        architecture=arch,
        name=str(meta.get("general.name", path.stem)),
        chat_template=template if isinstance(template, str) else None,
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        context_length=int(ctx) if isinstance(ctx, int) else None,
        kv_bytes_per_token=kv_bytes,
    )


def _kv_bytes_per_token(meta: dict[str, object], arch: str) -> int | None:
    """KV-cache bytes one token takes (llama.cpp's default f16 cache), for cache reporting."""

    def num(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    layers, embd, heads = num("block_count"), num("embedding_length"), num("attention.head_count")
    kv_heads = num("attention.head_count_kv") or heads
    if not layers or not embd or not heads or not kv_heads:
        return None  # per-layer head counts (arrays) and other exotic layouts: unknown
    k_len = num("attention.key_length") or embd // heads
    v_len = num("attention.value_length") or embd // heads
    return layers * kv_heads * (k_len + v_len) * 2
