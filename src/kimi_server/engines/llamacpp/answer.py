"""What the answer phase may produce: free text, text under a grammar, or tool calls.

The plan is made before anything streams, so every grammar it may use is compiled (and a bad
one refused with a 400) while the response can still be a plain HTTP error. Under
``tool_choice: "auto"`` the model decides between text and calls in a separate step
(``decide.py``); either branch is decoded under its grammar, so the result always parses.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from kimi_server.engines.llamacpp.answer_prefix import continued
from kimi_server.engines.llamacpp.grammar import (
    PROBE_LITERAL,
    CallSyntax,
    Grammar,
    calls_grammar,
    json_object_grammar,
    schema_grammar,
    text_grammar,
)
from kimi_server.engines.llamacpp.runner import CompletionResult, CompletionRunner
from kimi_server.engines.types import GenerationRequest, ToolSpec
from kimi_server.errors import InvalidRequestError

# A safety net, not the bound itself: LLGuidance limits its own compile work, and the wait
# includes queueing for a free slot on a busy server.
COMPILE_TIMEOUT_S = 120.0
_CACHE_SIZE = 512


@dataclass(frozen=True)
class AnswerPlan:
    syntax: CallSyntax
    tools: tuple[ToolSpec, ...]
    text: Grammar | None  # for a text (or structured) answer; None: unconstrained
    calls: Grammar | None  # for a tool-call answer; None: calls are not possible
    decide: Literal["text", "calls", "model"]
    # Partial Mode: text the text grammar writes first that the client sent as its prefix
    # (answer_prefix.py); dropped from the answer.
    echo: str = ""

    def grammars(self) -> list[tuple[str, Grammar]]:
        out: list[tuple[str, Grammar]] = []
        if self.text is not None and self.decide != "calls":
            out.append(("response_format", self.text))
        if self.calls is not None:
            out.append(("tools", self.calls))
        return out


def _output_grammar(request: GenerationRequest) -> Grammar | None:
    fmt = request.output_format
    if fmt.kind == "json_object":
        return json_object_grammar()
    if fmt.kind == "json_schema" and fmt.schema is not None:
        return schema_grammar(fmt.schema, strict=fmt.strict)
    return None


def plan_answer(request: GenerationRequest, syntax: CallSyntax) -> AnswerPlan:
    tools = tuple(t for t in request.tools if t.kind in ("function", "custom", "web_search"))
    choice = request.tool_choice
    structured = _output_grammar(request)
    if request.answer_prefix is not None:
        # A prefix is the start of the text answer: no call can follow it.
        if tools and choice.mode in ("required", "named"):
            raise InvalidRequestError(
                f"'{request.answer_prefix.param}': Partial Mode cannot be combined with a forced tool call.",
                param=request.answer_prefix.param,
            )
        structured, echo = continued(request, structured)
        return AnswerPlan(syntax, (), structured, None, "text", echo)
    if not tools or choice.mode == "none":
        return AnswerPlan(syntax, (), structured, None, "text")
    if choice.mode == "named":
        tools = tuple(t for t in tools if t.name == choice.name)
    # One call per turn when web search is declared: small models repeat a search call until the
    # budget runs out, and the answer may search again once it has the results.
    searching = any(t.kind == "web_search" for t in tools)
    calls = calls_grammar(syntax, tools, parallel=request.parallel_tool_calls and not searching)
    if choice.mode in ("required", "named"):
        return AnswerPlan(syntax, tools, None, calls, "calls")
    text = structured if structured is not None else text_grammar(syntax, tools)
    return AnswerPlan(syntax, tools, text, calls, "model")


class GrammarChecker:
    """Compiles grammars on the engine itself, before generation, and remembers the verdict.

    llama.cpp does not report a grammar that fails to compile: it samples unconstrained. So a
    probe generates two tokens under the grammar behind a forced literal; only a compiled
    grammar can produce that literal.
    """

    def __init__(self, runner: CompletionRunner, *, slot: int | None = None) -> None:
        self._runner = runner
        self._slot = slot
        self._verdicts: OrderedDict[str, bool] = OrderedDict()

    async def compiles(self, grammar: Grammar) -> bool:
        key = grammar.text()
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        body = {
            "prompt": "\n\n",
            "n_predict": 2,
            "grammar": grammar.probe_text(),
            "temperature": 0.0,
            "cache_prompt": False,
        }
        if self._slot is not None:
            body["id_slot"] = self._slot
        text = ""
        try:
            async with asyncio.timeout(COMPILE_TIMEOUT_S):
                async for item in self._runner.stream(body):
                    if isinstance(item, CompletionResult):
                        text = item.text
        except TimeoutError:
            raise InvalidRequestError(
                f"The schema took longer than {COMPILE_TIMEOUT_S:.0f} s to compile into a grammar; simplify it.",
                code="schema_too_complex",
            ) from None
        ok = bool(text) and (text.startswith(PROBE_LITERAL) or PROBE_LITERAL.startswith(text))
        self._verdicts[key] = ok
        if len(self._verdicts) > _CACHE_SIZE:
            self._verdicts.popitem(last=False)
        return ok

    async def check(self, plan: AnswerPlan, request: GenerationRequest) -> None:
        for where, grammar in plan.grammars():
            if await self.compiles(grammar):
                continue
            raise await self._blame(where, plan, request)

    async def _blame(self, where: str, plan: AnswerPlan, request: GenerationRequest) -> InvalidRequestError:
        """Finds which schema broke the grammar, so the error can name it."""
        if where == "tools":
            for i, tool in enumerate(request.tools):
                if tool not in plan.tools:
                    continue
                single = calls_grammar(plan.syntax, (tool,), parallel=False)
                if not await self.compiles(single):
                    return InvalidRequestError(
                        f"The grammar compiler rejected the parameters schema of tool "
                        f"{tool.name!r}: it is not a JSON Schema this server can enforce "
                        "(check types, formats, $ref targets and regular expressions).",
                        param=f"{tool.where or f'tools[{i}]'}.parameters",
                        code="invalid_schema",
                    )
        return InvalidRequestError(
            f"The grammar compiler rejected the {where.replace('_', ' ')} schema: it is not a "
            "JSON Schema this server can enforce (check types, formats, $ref targets and "
            "regular expressions).",
            param=where,
            code="invalid_schema",
        )
