"""The embedded model's tokenizer, rebuilt from its GGUF (engines/llamacpp/tokenizer.py), counts
a prompt exactly as llama.cpp does: checked against llama.cpp's own ``prompt_tokens`` on both
pulled models, for raw text and for conversations rendered through the model's chat template.
A GGUF whose tokenizer is not rebuilt gets an upper bound, never a crash. And the turns a long
prompt is read in (prefill.py)."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_server.engines.llamacpp.gguf_meta import read_gguf_info
from kimi_server.engines.llamacpp.phases import PhaseContext
from kimi_server.engines.llamacpp.prefill import Pace, Sharing, next_cut, prefill_in_turns, turns_to_run
from kimi_server.engines.llamacpp.runner import CompletionResult, CompletionRunner
from kimi_server.engines.llamacpp.template import ChatTemplate
from kimi_server.engines.llamacpp.tokenizer import ByteBound, ByteLevelBPE, load_prompt_tokenizer
from kimi_server.engines.types import GenerationRequest, Message, ReasoningBudget, ToolCallRecord, ToolSpec
from kimi_server.models.pull import resolve_model
from kimi_server.models.store import ModelStore, default_models_dir
from kimi_server.parsers.reasoning import get_reasoning_format

TEXTS = [
    "a\nb\nc\n" * 20,  # one token per character: four times a characters/4 estimate
    "line one\r\nline two\r\n\r\n  indented\r\n\r\r\n",
    "Grüße, naïve café — “quotes” ½ ① Ⅻ ٣ 東京タワー 한국어 Ελληνικά",
    "emoji 😀👍🏽👨\u200d👩\u200d👧 🇫🇷 ✔️ and a lone 🧪",
    "def f(x):\n\tif x  >  10:\n\t\treturn [i**2 for i in range(x)]  # comment\n    \n\n",
    "numbers 1234567 3.14159 0x1F 12,345 ٠١٢ and it's they'll I'M we'Ve",
    "   spaces    \t\t tabs\u00a0nbsp\u2003em   ",
    '{"a": [1, 2, {"b": null}], "c": "\\u00e9"} <tool_call>\n{"name": "x"}\n</tool_call>',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "Zero\u200bwidth a\u0301 combining \ufeffbom \U0001d54f math",
]

CONVERSATION = (
    Message("system", "You are terse.\r\nAnswer in one line."),
    Message("user", "x = 1\ny = 2\nprint(x + y)  # 🐍\n" * 3),
    Message("assistant", "", tool_calls=(ToolCallRecord("call_1", "run", '{"code": "print(3)"}'),)),
    Message("tool", "3\n", tool_call_id="call_1"),
    Message("user", "Ünïcödé\tand\r\n\r\nblank lines\n\n\n"),
)
TOOLS = (ToolSpec("run", "Runs Python.", {"type": "object", "properties": {"code": {"type": "string"}}}),)


def _gguf(name: str) -> Path:
    return Path(resolve_model(name, ModelStore(default_models_dir()), auto_pull=True))


@pytest.fixture(scope="module", params=["smollm2-135m", "qwen2.5-coder-0.5b"])
def model(request: pytest.FixtureRequest) -> Iterator[tuple[Path, Any]]:
    import xllamacpp

    path = _gguf(request.param)
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = 4096
    params.n_parallel = 1
    params.warmup = False
    params.verbosity = -1
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 1
    server = xllamacpp.Server(params)
    yield path, server
    del server


def llama_prompt_tokens(server: Any, text: str) -> int:
    result = server.handle_completions({"prompt": text, "n_predict": 1, "cache_prompt": False})
    return int(result["usage"]["prompt_tokens"])


@pytest.mark.e2e
def test_counts_equal_llama_cpp_for_raw_text(model: tuple[Path, Any]) -> None:
    path, server = model
    tokenizer = load_prompt_tokenizer(path)
    assert isinstance(tokenizer, ByteLevelBPE) and tokenizer.exact
    counts = [(tokenizer.count(text), llama_prompt_tokens(server, text)) for text in TEXTS]
    assert [mine for mine, _ in counts] == [theirs for _, theirs in counts]
    assert counts[0][0] == 120  # the multi-line text really is a token per character


@pytest.mark.e2e
def test_counts_equal_llama_cpp_for_a_rendered_conversation(model: tuple[Path, Any]) -> None:
    path, server = model
    info = read_gguf_info(path)
    template = ChatTemplate(info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)
    prompt = template.render(CONVERSATION, tools=TOOLS, history_reasoning=("<think>", "</think>"))
    assert load_prompt_tokenizer(path).count(prompt) == llama_prompt_tokens(server, prompt)


# -- tokenizers that are not rebuilt ------------------------------------------------------------


def _write_gguf(path: Path, meta: dict[str, str]) -> Path:
    """A header-only GGUF with string metadata."""

    def string(s: str) -> bytes:
        raw = s.encode()
        return struct.pack("<Q", len(raw)) + raw

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(meta))
    for key, value in meta.items():
        body += string(key) + struct.pack("<I", 8) + string(value)
    path.write_bytes(body)
    return path


@pytest.mark.parametrize(
    "meta",
    [
        {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default"},  # SentencePiece
        {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "some-future-pre"},
        {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2"},  # arrays missing
    ],
)
def test_a_tokenizer_not_rebuilt_gets_an_upper_bound(tmp_path: Path, meta: dict[str, str]) -> None:
    tokenizer = load_prompt_tokenizer(_write_gguf(tmp_path / "m.gguf", meta))
    assert not tokenizer.exact
    text = "a\nb\nc\n 東京 😀"
    assert tokenizer.count(text) >= len(text.encode())


def test_a_damaged_gguf_gets_an_upper_bound(tmp_path: Path) -> None:
    damaged = tmp_path / "m.gguf"
    damaged.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    tokenizer = load_prompt_tokenizer(damaged)
    assert isinstance(tokenizer, ByteBound)
    assert tokenizer.count("héllo") == len("héllo".encode()) + 4


# -- reading a prompt in turns (engines/llamacpp/prefill.py) --------------------------------------


class TurnLlama:
    """Counts one token per character; the slot holds ``held`` characters before the first call."""

    def __init__(self, held: int) -> None:
        self.prompts: list[str] = []
        self.slot = held

    def handle_completions(self, body: dict[str, Any], callback: Any = None) -> None:
        prompt = body["prompt"]
        self.prompts.append(prompt)
        cached = min(self.slot, len(prompt) - 1) if body["cache_prompt"] else 0
        self.slot = len(prompt)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": 1}
        # 10 ms a token, as llama.cpp's timings would say.
        timings = {"cache_n": cached, "prompt_ms": 10.0 * (len(prompt) - cached)}
        callback({"choices": [{"text": "", "finish_reason": "length"}], "usage": usage, "timings": timings})


def _turns(
    held: int, *, shared: bool, cached_text: str | None = None, pace: Pace | None = None
) -> tuple[list[int], int | None]:
    prompt = "x" * 100
    llama = TurnLlama(held)
    gen = GenerationRequest("kimi-k3.1-pro", (Message("user", prompt),), "low", ReasoningBudget(1, 2), 4)

    async def run() -> int | None:
        ctx = PhaseContext(CompletionRunner(llama), gen, get_reasoning_format("prompted"), {}, slot=0)
        cuts = turns_to_run(list(range(10, 100, 10)), prompt, cached_text)
        return await prefill_in_turns(ctx, prompt, cuts, stride=4, shared=lambda: shared, pace=pace)

    held_before = asyncio.run(run())
    return [len(p) for p in llama.prompts], held_before


def test_turns_are_short_while_others_run_and_long_alone() -> None:
    assert _turns(0, shared=True) == ([10, 20, 30, 40, 50, 60, 70, 80, 90], 0)
    assert _turns(0, shared=False) == ([40, 80], 0)  # the last 20 are left to the request's call


def test_a_prompt_behind_its_pace_reads_longer_turns_beside_others() -> None:
    # Started 3 s ago at 10 ms a token with slowdown 3: 100 tokens were due, so after one short
    # turn (which measures the speed) the turns are long ones until the prompt is read.
    late = Pace(slowdown=3, turn=10, started=time.monotonic() - 3)
    assert _turns(0, shared=True, pace=late) == ([10, 50, 90], 0)
    # On time (just started), the turns stay short.
    assert _turns(0, shared=True, pace=Pace(slowdown=3, turn=10))[0][:3] == [10, 20, 30]


def test_the_pace_is_the_cheapest_turn_slowed_down() -> None:
    pace = Pace(slowdown=3, turn=8, started=100.0)
    assert pace.cuts_due(now=200.0) == 0  # nothing measured: no pace yet
    pace.observe(
        CompletionResult("", "length", prompt_tokens=108, cached_tokens=100, completion_tokens=0, prompt_ms=160)
    )
    pace.observe(
        CompletionResult("", "length", prompt_tokens=116, cached_tokens=108, completion_tokens=0, prompt_ms=80)
    )
    pace.observe(CompletionResult("", "length", prompt_tokens=9, cached_tokens=9, completion_tokens=0, prompt_ms=5))
    assert pace.seconds_per_token == 0.01  # the cheaper turn; a turn that computed nothing is no figure
    # 2.4 s at 30 ms a token (10 ms, 3x slower) is 80 tokens: ten 8-token turns.
    assert pace.cuts_due(now=102.4) == 10
    # Twelve turns read by then is two turns (0.48 s) ahead of the pace; ten is none.
    assert round(pace.ahead(12, now=102.4), 6) == 0.48 and pace.ahead(10, now=102.4) == 0
    # Alone: a long turn; beside others: one cut, or as many as catch up, at most a long turn.
    assert next_cut(3, shared=False, stride=8, due=0) == 11
    assert next_cut(3, shared=True, stride=8, due=2) == 4
    assert next_cut(3, shared=True, stride=8, due=7) == 6
    assert next_cut(3, shared=True, stride=8, due=40) == 11


def test_others_count_as_busy_for_a_moment_after_they_were_last_seen() -> None:
    # A key streaming request after request frees the engine only between two requests.
    seen = [False, True, False, False]
    busy = Sharing(lambda: seen.pop(0), grace=0.2)
    assert busy() is False  # never seen: alone
    assert busy() is True
    assert busy() is True  # gone a moment: still busy
    time.sleep(0.25)
    assert busy() is False


def test_turns_skip_what_the_cache_holds_and_report_the_real_hit() -> None:
    # The slot holds the first 35 characters: turns inside them would cut its KV short.
    lengths, held = _turns(35, shared=True, cached_text="x" * 35)
    assert lengths == [40, 50, 60, 70, 80, 90] and held == 35
