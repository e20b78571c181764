"""The embedded model's own tokenizer, rebuilt from its GGUF, to count a prompt before admission.

llama.cpp's in-process server has no tokenize call, but the GGUF carries everything its
tokenizer uses: the vocabulary, the BPE merges, each token's type and the name of the
pre-tokenizer (``tokenizer.ggml.pre``). For byte-level BPE models (``tokenizer.ggml.model`` =
``gpt2``) with a pre-tokenizer named below, that rebuilds the same tokenizer with HuggingFace
``tokenizers``: the same split patterns llama.cpp applies for that name, the byte-to-character
map, the merges, and the control and user-defined tokens matched whole in the text (llama.cpp
parses special tokens in a completion prompt). ``tests/test_prompt_tokens.py`` checks the count
against llama.cpp's own ``prompt_tokens`` on the pulled models.

Anything else (SentencePiece, WordPiece, an unknown pre-tokenizer, a damaged header) gets a
bound instead of a count: the prompt's UTF-8 bytes plus a few tokens. Every token of those
tokenizers covers at least one byte of the text, apart from an optional leading space marker
and the BOS/EOS tokens, so the bound is never below the true count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kimi_server.engines.llamacpp.gguf_meta import read_gguf_meta

log = logging.getLogger(__name__)

# llama.cpp's token types: the ones it matches whole in a prompt when parsing special tokens.
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4
_SPECIAL_TYPES = frozenset({_UNKNOWN, _CONTROL, _USER_DEFINED})

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = _QWEN2.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


@dataclass(frozen=True)
class PreTokenizer:
    """The patterns llama.cpp splits the text with, in order, before BPE; ``ignore_merges``:
    a piece that is itself a token is taken whole (llama-3 style)."""

    patterns: tuple[str, ...]
    ignore_merges: bool = False


_QWEN2_PRE = PreTokenizer((_QWEN2,))
_DIGITS_GPT2 = PreTokenizer((r"\p{N}", _GPT2))
_GPT2_PRE = PreTokenizer((_GPT2,))
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True)

# tokenizer.ggml.pre -> the split llama.cpp applies for it (llama-vocab.cpp). Only these are
# rebuilt; the qwen2 and smollm rows are the ones checked against llama.cpp in the tests.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "qwen2": _QWEN2_PRE,
    "stablelm2": _QWEN2_PRE,
    "deepseek-r1-qwen": _QWEN2_PRE,
    "smollm": _DIGITS_GPT2,
    "starcoder": _DIGITS_GPT2,
    "refact": _DIGITS_GPT2,
    "command-r": _DIGITS_GPT2,
    "codeshell": _DIGITS_GPT2,
    "gpt-2": _GPT2_PRE,
    "phi-2": _GPT2_PRE,
    "mpt": _GPT2_PRE,
    "olmo": _GPT2_PRE,
    "llama3": _LLAMA3_PRE,
    "llama-v3": _LLAMA3_PRE,
    "llama-bpe": _LLAMA3_PRE,
}


class PromptTokenizer(Protocol):
    exact: bool  # False: ``count`` is an upper bound, not llama.cpp's figure
    kind: str  # what was built, for the start-up log

    def count(self, text: str) -> int: ...

    def cuts(self, text: str, every: int) -> list[int]:
        """Character offsets that split ``text`` into pieces of about ``every`` tokens each
        (ascending, inside the text), for prefilling a long prompt in turns."""
        ...


class ByteBound:
    """An upper bound for any tokenizer whose tokens each cover at least one byte."""

    exact = False

    def __init__(self, reason: str, extra: int = 4) -> None:
        self.kind = f"bound ({reason})"
        self._extra = extra  # a leading space marker, BOS and EOS

    def count(self, text: str) -> int:
        return len(text.encode("utf-8", errors="replace")) + self._extra

    def cuts(self, text: str, every: int) -> list[int]:
        # A token covers a character or more in the tokenizers this bound stands for.
        return list(range(every, len(text), every))


class ByteLevelBPE:
    """The model's byte-level BPE, as llama.cpp tokenizes a prompt (special tokens parsed)."""

    exact = True

    def __init__(self, meta: dict[str, object], pre_name: str, pre: PreTokenizer) -> None:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        tokens = _strings(meta.get("tokenizer.ggml.tokens"))
        types = meta.get("tokenizer.ggml.token_type")
        merges = [_merge(m) for m in _strings(meta.get("tokenizer.ggml.merges"))]
        vocab = {token: i for i, token in enumerate(tokens)}
        model = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges)
        tokenizer = Tokenizer(model)
        splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in pre.patterns]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
        tokenizer.decoder = decoders.ByteLevel()
        if isinstance(types, list):
            special = [
                AddedToken(tokens[i], special=True, normalized=False)
                for i, kind in enumerate(types)
                if kind in _SPECIAL_TYPES and i < len(tokens) and tokens[i]
            ]
            tokenizer.add_special_tokens(special)
        self._tokenizer = tokenizer
        # llama.cpp adds these around a completion prompt when the GGUF asks for them.
        self._framing = int(meta.get("tokenizer.ggml.add_bos_token") is True) + int(
            meta.get("tokenizer.ggml.add_eos_token") is True
        )
        self.kind = f"byte-level BPE ({pre_name}, {len(tokens)} tokens)"

    def count(self, text: str) -> int:
        return len(self.encode(text)) + self._framing

    def encode(self, text: str) -> list[int]:
        return list(self._encoding(text).ids)

    def cuts(self, text: str, every: int) -> list[int]:
        offsets = self._encoding(text).offsets
        starts = (offsets[i][0] for i in range(every, len(offsets), every))
        return sorted({start for start in starts if 0 < start < len(text)})

    def _encoding(self, text: str) -> Any:
        # The batch call lets go of the GIL while it works (the single one holds it): a long
        # prompt tokenized in a worker thread then never stalls the event loop.
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=False)
        return encoding


_TOKENIZER_ARRAYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"})


def load_prompt_tokenizer(path: Path) -> PromptTokenizer:
    """The GGUF's own tokenizer where it can be rebuilt, else the byte bound; never raises."""
    try:
        meta = read_gguf_meta(path, _TOKENIZER_ARRAYS)
    except Exception as exc:  # a damaged or exotic header: the model may still load
        log.warning("cannot read the tokenizer of %s (%s); counting prompts by bytes", path.name, exc)
        return ByteBound("unreadable GGUF tokenizer")
    model = meta.get("tokenizer.ggml.model")
    pre_name = str(meta.get("tokenizer.ggml.pre", "default"))
    pre = PRE_TOKENIZERS.get(pre_name)
    if not meta.get("tokenizer.ggml.tokens") or not meta.get("tokenizer.ggml.merges"):
        log.warning("%s carries no BPE vocabulary; counting prompts by bytes", path.name)
        return ByteBound("no vocabulary")
    if model != "gpt2" or pre is None:
        log.info("tokenizer %s/%s of %s is not rebuilt; counting prompts by bytes", model, pre_name, path.name)
        return ByteBound(f"tokenizer {model}/{pre_name}")
    try:
        return ByteLevelBPE(meta, pre_name, pre)
    except Exception as exc:
        log.warning("cannot rebuild the tokenizer of %s (%s); counting prompts by bytes", path.name, exc)
        return ByteBound("tokenizer build failed")


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _merge(text: str) -> tuple[str, str]:
    # A merge is two tokens joined by one space; a byte-level token never holds a plain space,
    # but the first may start with one in exotic vocabularies, hence the search from 1.
    cut = text.find(" ", 1)
    if cut < 0:
        raise ValueError(f"malformed merge {text!r}")
    return text[:cut], text[cut + 1 :]
