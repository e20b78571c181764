"""The reasoning and answer phases over a scripted llama.cpp completion server (no model)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncGenerator
from typing import Any

from kimi_server.engines.llamacpp.answer import plan_answer
from kimi_server.engines.llamacpp.grammar import syntax_for_template
from kimi_server.engines.llamacpp.phases import (
    ANSWER_LEAD,
    PhaseContext,
    answer_turn,
    prompted_generation,
)
from kimi_server.engines.llamacpp.repetition import RepetitionLimits
from kimi_server.engines.llamacpp.runner import CompletionRunner
from kimi_server.engines.llamacpp.template import CHATML, ChatTemplate
from kimi_server.engines.types import (
    CachePolicy,
    ContentDelta,
    EngineEvent,
    Finish,
    GenerationRequest,
    Message,
    OutputFormat,
    ReasoningBudget,
    ReasoningDelta,
)
from kimi_server.parsers.reasoning import MarkerScrub, PhraseScrub, get_reasoning_format


class FakeLlama:
    """Speaks xllamacpp's handle_completions protocol: streamed chunks, then a usage chunk.

    Generates ``word `` tokens; stops at ``n_predict``, or after ``natural_stop`` tokens when
    end-of-turn is not masked (as a model that wants to stop would).
    """

    def __init__(self, natural_stop: int = 1000, prompt_tokens: int = 10, context: int = 10**9) -> None:
        self.context = context
        self.calls: list[dict[str, Any]] = []
        self.natural_stop = natural_stop
        self.prompt_tokens = prompt_tokens
        self.stopped = threading.Event()

    def handle_completions(self, body: dict[str, Any], callback: Any = None) -> None:
        self.calls.append(body)
        limit = body["n_predict"]
        if not body.get("ignore_eos"):
            limit = min(limit, self.natural_stop)
        limit = min(limit, self.context)
        for i in range(limit):
            if callback({"choices": [{"text": f"w{i} ", "finish_reason": None}]}):
                self.stopped.set()
                return
        reason = "length" if limit in (body["n_predict"], self.context) else "stop"
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": limit}
        timings = {"cache_n": 4 if len(self.calls) == 1 else self.prompt_tokens}
        callback({"choices": [{"text": "", "finish_reason": reason}], "usage": usage, "timings": timings})


def request(floor: int, cap: int, max_out: int, separate: bool = True) -> GenerationRequest:
    return GenerationRequest(
        model="kimi-k3.1-pro",
        messages=(Message("user", "hi"),),
        effort="low",
        budget=ReasoningBudget(floor, cap),
        max_output_tokens=max_out,
        cache=CachePolicy(separate_writes=separate),
    )


async def answer_prompt(reasoning: str) -> str:
    """Stands in for the engine's: the chat template would render the conversation, the chosen
    attempt as the assistant's turn and the follow-up; here the attempt is enough to check."""
    return f"ANSWER[{reasoning}]"


def run(llama: FakeLlama, req: GenerationRequest) -> list[EngineEvent]:
    async def main() -> list[EngineEvent]:
        runner = CompletionRunner(llama)
        fmt = get_reasoning_format("prompted")
        ctx = PhaseContext(runner, req, fmt, {}, answer_prompt=answer_prompt)
        plan = plan_answer(req, syntax_for_template(CHATML))
        return [e async for e in prompted_generation(ctx, "PROMPT", plan)]

    return asyncio.run(main())


def json_request(floor: int, cap: int, max_out: int) -> GenerationRequest:
    return dataclasses.replace(request(floor, cap, max_out), output_format=OutputFormat("json_object"))


def test_attempts_until_the_floor_then_the_chosen_one_is_the_answer() -> None:
    llama = FakeLlama(natural_stop=2)
    events = run(llama, request(floor=12, cap=50, max_out=100))
    # The first attempt is one plain call (2 tokens); the next two start with a 3-token lead
    # (3 + 2 each), which reaches the floor of 12. Each starts from the conversation. Free text
    # needs nothing more: the chosen attempt is the answer.
    assert len(llama.calls) == 5
    first, leads, rests = llama.calls[0], llama.calls[1::2], llama.calls[2::2]
    assert first["prompt"] == "PROMPT" and first["n_predict"] == 50
    assert "ignore_eos" not in first and "logit_bias" not in first
    assert all(c["prompt"] == "PROMPT" for c in leads)
    assert all(c["ignore_eos"] is True and c["n_predict"] == 3 for c in leads)
    assert all(["<", False] in c["logit_bias"] for c in leads)  # no later attempt opens with a tag
    assert all("ignore_eos" not in c and c["prompt"] == "PROMPT" + "w0 w1 w2 " for c in rests)
    assert all("</think>" in c["stop"] and "<answer>" in c["stop"] for c in llama.calls)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == (
        "w0 w1 \n\nAttempt 2:\nw0 w1 w2 w0 w1 \n\nAttempt 3:\nw0 w1 w2 w0 w1 \n\nGoing with attempt 2."
    )
    content = [e.text for e in events if isinstance(e, ContentDelta)]
    assert content == ["w0 w1 w2 w0 w1 "]  # already generated: shown whole, in one delta
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "stop"
    # The answer is the chosen attempt: its tokens were generated once, as reasoning, and are
    # counted (billed) once.
    assert finish.usage.reasoning_tokens == 12
    assert finish.usage.completion_tokens == 12
    assert finish.usage.prompt_tokens == 10 and finish.usage.cached_tokens == 4
    assert finish.usage.cache_write_tokens == 6


def test_the_clients_stop_sequences_end_the_attempts() -> None:
    llama = FakeLlama(natural_stop=2)
    run(llama, dataclasses.replace(request(floor=12, cap=50, max_out=100), stop=("STOP",)))
    assert all("STOP" in c["stop"] and "</think>" in c["stop"] for c in llama.calls)
    # Under a grammar the attempts are drafts, not the answer: the client's stops are not theirs.
    llama = FakeLlama(natural_stop=2)
    req = dataclasses.replace(json_request(floor=12, cap=50, max_out=100), stop=("STOP",))
    run(llama, req)
    assert all("STOP" not in c["stop"] for c in llama.calls[:-1])


def test_under_a_grammar_the_answer_has_the_chosen_attempt_as_its_draft() -> None:
    llama = FakeLlama(natural_stop=2)
    events = run(llama, json_request(floor=12, cap=50, max_out=100))
    *reasoning_calls, answer_call = llama.calls
    assert len(reasoning_calls) == 5
    # The chosen attempt (finished lines only) in a prompt of its own, decoded under the grammar.
    assert answer_call["prompt"] == "ANSWER[w0 w1 w2 w0 w1]" and "grammar" in answer_call
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert finish.usage.reasoning_tokens == 12 and finish.usage.completion_tokens == 14


class LoopingReasoner(FakeLlama):
    """Loops on one token while reasoning (no grammar); answers normally under a grammar."""

    def handle_completions(self, body: dict[str, Any], callback: Any = None) -> None:
        if "grammar" in body:
            return super().handle_completions(body, callback)
        self.calls.append(body)
        for _ in range(body["n_predict"]):
            if callback({"choices": [{"text": "x ", "finish_reason": None}], "timings": {"predicted_n": 1}}):
                return
        raise AssertionError("the repetition guard never cut the loop")


def test_looping_reasoning_ends_the_reasoning_but_the_constrained_answer_still_comes() -> None:
    llama = LoopingReasoner(natural_stop=2)

    async def main() -> list[EngineEvent]:
        runner = CompletionRunner(llama)
        req = json_request(floor=40, cap=200, max_out=400)
        loops = RepetitionLimits(max_ngram=4, min_repeats=4, min_tokens=10)
        ctx = PhaseContext(
            runner, req, get_reasoning_format("prompted"), {}, answer_prompt=answer_prompt, repetition=loops
        )
        plan = plan_answer(req, syntax_for_template(CHATML))
        return [e async for e in prompted_generation(ctx, "PROMPT", plan)]

    events = asyncio.run(main())
    # One attempt, cut by the guard: no more attempts after it (they would loop as well) ...
    reasoning_calls = [c for c in llama.calls if "grammar" not in c]
    assert len(reasoning_calls) == 1
    # ... and the answer under the grammar still comes, where it used to end the request.
    assert "grammar" in llama.calls[-1]
    assert "".join(e.text for e in events if isinstance(e, ContentDelta))
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.usage.reasoning_tokens < 200


def test_seeded_attempts_each_get_their_own_seed() -> None:
    llama = FakeLlama(natural_stop=2)
    req = request(floor=12, cap=50, max_out=100)
    run(llama, dataclasses.replace(req, seed=7))
    # The first attempt gets the request's own seed: it is what a direct call with it gives.
    assert [c["seed"] for c in llama.calls] == [7, 8, 8, 9, 9]
    llama = FakeLlama(natural_stop=2)
    run(llama, dataclasses.replace(json_request(floor=12, cap=50, max_out=100), seed=7))
    assert [c["seed"] for c in llama.calls] == [7, 8, 8, 9, 9, 7]


def test_reasoning_cap_and_output_cap() -> None:
    llama = FakeLlama()
    events = run(llama, request(floor=2, cap=6, max_out=10))
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "length"
    assert finish.usage.reasoning_tokens == 6
    assert finish.usage.completion_tokens == 10
    # The attempt (6 tokens, cut by the reasoning cap) is the answer, shown whole in one delta
    # and continued token by token by the 4 output tokens left.
    assert [e.text for e in events if isinstance(e, ContentDelta)] == [
        "".join(f"w{i} " for i in range(6)),
        *(f"w{i} " for i in range(4)),  # the fake model counts from w0 in every call
    ]


def test_output_cap_inside_reasoning_leaves_the_attempt_so_far_as_the_answer() -> None:
    llama = FakeLlama()
    events = run(llama, request(floor=2, cap=50, max_out=4))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == "w0 w1 w2 w3 "
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == reasoning
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "length"
    assert finish.usage.completion_tokens == 4
    assert len(llama.calls) == 1


def test_k3_reports_no_cache_writes() -> None:
    finish = run(FakeLlama(natural_stop=2), request(floor=1, cap=4, max_out=20, separate=False))[-1]
    assert isinstance(finish, Finish) and finish.usage.cache_write_tokens == 0


def test_closing_the_stream_stops_llama() -> None:
    llama = FakeLlama(natural_stop=10**7)

    async def main() -> None:
        runner = CompletionRunner(llama)
        req = request(floor=0, cap=10_000_000, max_out=10_000_000)
        fmt = get_reasoning_format("prompted")
        ctx = PhaseContext(runner, req, fmt, {}, answer_prompt=answer_prompt)
        events = prompted_generation(ctx, "PROMPT", plan_answer(req, syntax_for_template(CHATML)))
        assert isinstance(events, AsyncGenerator)  # closable, as the server closes it
        seen = 0
        async for _ in events:
            seen += 1
            if seen > ANSWER_LEAD:  # inside the long call after the attempt's lead
                break
        await events.aclose()
        for _ in range(100):
            if llama.stopped.is_set():
                break
            await asyncio.sleep(0.05)
        assert runner.cancelled == 1

    asyncio.run(main())
    assert llama.stopped.is_set()


def test_context_running_out_ends_with_length() -> None:
    llama = FakeLlama(context=7)
    events = run(llama, request(floor=20, cap=50, max_out=100))
    assert len(llama.calls) == 1  # neither another attempt nor a continuation follows
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "length"
    # The cut attempt is the answer as far as it got.
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "w0 w1 w2 w3 w4 w5 w6 "
    assert finish.usage.reasoning_tokens == 7 and finish.usage.completion_tokens == 7


# The floor is a floor, and no marker text reaches an answer.


class ClosingLlama(FakeLlama):
    """A model that writes ``</think>`` after ``closes_after`` tokens of every call, spelled so
    that no ban stops it, and that writes marker text into its answers."""

    def __init__(self, closes_after: int, answer: str = "A </think>B<answer>C", line: int = 0) -> None:
        super().__init__()
        self.closes_after = closes_after
        self.answer = answer
        self.line = line  # reasoning tokens per line (0: one line)

    def handle_completions(self, body: dict[str, Any], callback: Any = None) -> None:
        self.calls.append(body)
        if not body["prompt"].startswith("ANSWER["):  # an attempt, continued where the prompt ends
            pieces = [
                f"r{i}" + ("\n" if self.line and (i + 1) % self.line == 0 else " ") for i in range(self.closes_after)
            ] + ["</think>"]
            said = body["prompt"].removeprefix("PROMPT")
            while said and pieces and said.startswith(pieces[0]):
                said, pieces = said[len(pieces[0]) :], pieces[1:]
        else:  # continues the answer from what the prompt already holds of it
            rest = self.answer[len(body["prompt"].rsplit("]", 1)[-1]) :]
            pieces = [rest[i : i + 3] for i in range(0, len(rest), 3)]
        stops = body.get("stop") or []
        text, sent, n, reason = "", 0, 0, "length"
        for piece in pieces:
            if n == body["n_predict"]:
                break
            n += 1
            text += piece
            hit = next((s for s in stops if s in text), None)
            # As llama.cpp: text that may still become a stop sequence is held back, and the
            # stop sequence itself is never sent.
            safe = (
                text.index(hit)
                if hit is not None
                else len(text)
                - max((k for s in stops for k in range(len(s), 0, -1) if text.endswith(s[:k])), default=0)
            )
            if safe > sent and callback({"choices": [{"text": text[sent:safe], "finish_reason": None}]}):
                return
            sent = max(sent, safe)
            if hit is not None:
                reason = "stop"
                break
        else:
            reason = "stop"
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": n}
        callback({"choices": [{"text": "", "finish_reason": reason}], "usage": usage, "timings": {}})


def test_an_attempt_ends_at_a_marker_and_the_floor_takes_more_attempts() -> None:
    llama = ClosingLlama(closes_after=4)
    events = run(llama, request(floor=12, cap=20, max_out=100))
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert finish.usage.reasoning_tokens >= 12
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert "</think>" not in reasoning and "Attempt 2:" in reasoning
    # The marker ended each attempt; the next one started from the conversation again.
    assert [c["prompt"] for c in llama.calls if c.get("ignore_eos")][:2] == ["PROMPT"] * 2


def test_an_attempt_cut_by_the_cap_is_continued_to_its_end_as_the_answer() -> None:
    llama = ClosingLlama(closes_after=8)
    events = run(llama, dataclasses.replace(request(floor=0, cap=5, max_out=100), seed=3))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert reasoning == "r0 r1 r2 r3 r4 "
    assert content == "r0 r1 r2 r3 r4 r5 r6 r7 "  # ends at the marker, which it never shows
    last = llama.calls[-1]
    assert last["prompt"] == "PROMPT" + reasoning and last["n_predict"] == 100 - 5
    assert {"<think>", "</think>", "<answer>"} <= set(last["stop"]) and last["seed"] == 3
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "stop"
    # The copy is not counted again: the reasoning, then what continued it.
    assert finish.usage.reasoning_tokens == 5 and finish.usage.completion_tokens == 5 + 4


def test_a_continued_answer_cut_by_the_output_cap_ends_with_length() -> None:
    llama = ClosingLlama(closes_after=50)
    events = run(llama, request(floor=0, cap=5, max_out=12))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert content == "".join(f"r{i} " for i in range(12))
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == "length"
    assert finish.usage.completion_tokens == 12


def test_answer_under_a_grammar_sees_only_finished_lines_of_a_cut_attempt() -> None:
    llama = ClosingLlama(closes_after=50, line=3)
    events = run(llama, json_request(floor=0, cap=5, max_out=100))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == "r0 r1 r2\nr3 r4 "  # the client sees all of it
    assert llama.calls[-1]["prompt"] == "ANSWER[r0 r1 r2]"


def test_marker_text_scrubbed_under_a_grammar() -> None:
    scrub = MarkerScrub(("<think>", "</think>", "<answer>", "</answer>"))
    stream = ['{"a": "x</th', "ink>y<", "answ", 'er>z<thi</think>nk>"}', "</"]
    out = "".join(scrub.feed(p) for p in stream) + scrub.flush()
    assert out == '{"a": "xyz"}</'


def test_marker_variants_scrubbed() -> None:
    scrub = MarkerScrub(get_reasoning_format("prompted").markers)
    stream = ["< think>\n80", " is < /Answer >it <", "b>x</b> a<b", "<"]
    out = "".join(scrub.feed(p) for p in stream) + scrub.flush()
    assert out == "\n80 is it <b>x</b> a<b<"


def test_the_drafts_framing_never_reaches_an_answer() -> None:
    """A small model may copy the system turn that carries its draft; those sentences are the
    server's words, not the answer."""
    fmt = get_reasoning_format("prompted")
    scrub = PhraseScrub(fmt.scaffold)
    note = fmt.follow_up.format(draft="Mercury is closest.")
    text = note + "\n\nMercury, then Venus."
    out = "".join(scrub.feed(text[i : i + 5]) for i in range(0, len(text), 5)) + scrub.flush()
    assert " ".join(out.split()) == "Mercury is closest. Mercury, then Venus."
    plain = PhraseScrub(fmt.scaffold)
    assert plain.feed("A draft is fine. ") + plain.flush() == "A draft is fine."


def test_the_answer_prompt_puts_the_draft_after_the_conversation() -> None:
    fmt = get_reasoning_format("prompted")
    req = request(floor=0, cap=5, max_out=100)
    template = ChatTemplate(CHATML)

    async def render() -> str:
        return await answer_turn(template, req, fmt)("The draft.")

    prompt = asyncio.run(render())
    conversation = template.render(req.messages).removesuffix("<|im_start|>assistant\n")
    assert prompt.startswith(conversation)  # the attempts' KV and the prompt cache still hold
    assert prompt.endswith(
        "<|im_start|>system\n" + fmt.follow_up.format(draft="The draft.") + "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_blank_draft_leaves_the_answer_to_the_conversation_itself() -> None:
    class BlankAttempts(FakeLlama):
        def handle_completions(self, body: dict[str, Any], callback: Any = None) -> None:
            if body["prompt"].startswith("ANSWER["):
                raise AssertionError("no draft to show")
            if body["prompt"] == "PROMPT" and body.get("ignore_eos"):
                self.calls.append(body)  # an attempt that says nothing
                usage = {"prompt_tokens": 10, "completion_tokens": 3}
                callback({"choices": [{"text": "  \n", "finish_reason": None}]})
                callback({"choices": [{"text": "", "finish_reason": "stop"}], "usage": usage})
                return
            super().handle_completions(body, callback)

    llama = BlankAttempts(natural_stop=2)
    events = run(llama, request(floor=3, cap=10, max_out=100))
    assert llama.calls[-1]["prompt"].startswith("PROMPT")  # the answer: the conversation's own turn
    assert isinstance(events[-1], Finish) and events[-1].reason == "stop"
