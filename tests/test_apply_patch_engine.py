"""The custom tool ``apply_patch`` on the real embedded engine with the tiny model: the call is a
patch in the documented format, streamed as custom tool-call deltas.

(Chat Completions has no custom tools; the Responses endpoint maps them onto the same engine
events, so the engine is tested directly here.)
"""

from __future__ import annotations

import asyncio
import re

import pytest

from kimi_server.engines.llamacpp.embedded_config import EmbeddedConfig
from kimi_server.engines.llamacpp.engine import EmbeddedEngine
from kimi_server.engines.types import (
    Finish,
    GenerationRequest,
    Message,
    ReasoningBudget,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)
from tests.conftest import TEST_MODEL, model_path

pytestmark = pytest.mark.e2e

MODEL = model_path(TEST_MODEL)
# The format of docs/tools-and-structured-output.md, written independently of the grammar.
_PATH = r"[^\s*][^\n]*"
_HUNK = r"(@@[^\n]*\n)?([ +\-][^\n]*\n)+(\*\*\* End of File\n)?"
_OP = (
    rf"(\*\*\* Add File: {_PATH}\n(\+[^\n]*\n)*"
    rf"|\*\*\* Delete File: {_PATH}\n"
    rf"|\*\*\* Update File: {_PATH}\n(\*\*\* Move to: {_PATH}\n)?({_HUNK})+)"
)
PATCH = re.compile(rf"\*\*\* Begin Patch\n({_OP})+\*\*\* End Patch")


def test_the_patch_format_regex_reads_the_documented_examples() -> None:
    good = (
        "*** Begin Patch\n*** Update File: a.py\n@@ def f():\n-    return 1\n+    return 2\n"
        "*** Add File: b.txt\n+hi\n*** Delete File: c.txt\n*** End Patch"
    )
    assert PATCH.fullmatch(good)
    assert not PATCH.fullmatch("*** Begin Patch\n*** End Patch")
    assert not PATCH.fullmatch("*** Begin Patch\n*** Update File: a.py\n*** End Patch")


def test_apply_patch_call_is_a_patch_in_the_documented_format() -> None:
    assert MODEL.exists(), "run `kimi-server models pull smollm2-135m` (scripts/test does)"
    request = GenerationRequest(
        model="kimi-k3.1-pro",
        messages=(Message("user", "Create a file hello.txt that says Hello, world."),),
        effort="low",
        budget=ReasoningBudget(4, 16),
        max_output_tokens=400,
        tools=(ToolSpec("apply_patch", "Edits files in the workspace.", kind="custom"),),
        tool_choice=ToolChoice("required"),
        parallel_tool_calls=False,
        seed=3,
    )

    async def go() -> list[object]:
        engine = EmbeddedEngine(EmbeddedConfig(MODEL, n_ctx=4096, n_parallel=2, n_threads=2))
        await engine.start()
        try:
            return [event async for event in engine.generate(request)]
        finally:
            await engine.close()

    events = asyncio.run(go())
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas and deltas[0].name == "apply_patch" and deltas[0].kind == "custom"
    assert deltas[0].id and deltas[0].id.startswith("call_")
    assert all(d.index == 0 and d.kind == "custom" for d in deltas)
    patch = "".join(d.arguments for d in deltas)
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "tool_calls", (finish, patch)
    assert PATCH.fullmatch(patch), patch
