"""Does the reasoning phase help? Answer quality with and without it, measured in one run.

A fixed set of short questions with one right answer (``answer_quality.json``: arithmetic, facts,
unit conversions, simple code) is answered three ways by the same GGUF:

- ``direct``: llama.cpp alone (xllamacpp's ``handle_completions``), the prompt rendered with the
  model's own chat template, no reasoning: the baseline;
- ``low`` and the default effort (``max``): through kimi-server and the openai SDK.

Requests run concurrently (llama.cpp slots) to keep the run short. Answers are sampled (the
server's default temperature), so one pass over 50 questions moves by several answers from run
to run; ``--rounds`` asks every question that many times in each variant. It prints each score
and the ratio of the with-reasoning score to the direct one (1.0 = as good as answering directly).

The variants are paired: the n-th ask of a question carries the same ``seed`` in every variant
(common random numbers). The reasoning's first attempt is the model's direct reply with that
seed, so the scores differ only where the later attempts and the choice among them changed the
answer, and the ratio no longer moves with which samples a run happened to draw. Each score is
still that of sampled answers: a seed picks one sample, as an unseeded request would.
``--unpaired`` sends no seeds.

    python -m benchmarks.answer_quality [--model qwen2.5-coder-0.5b] [--rounds 2] [--parallel 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUESTIONS = Path(__file__).with_name("answer_quality.json")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w])")


@dataclass(frozen=True)
class Question:
    question: str
    answers: tuple[str, ...]
    case: bool = False  # text answers compared case-sensitively (chemical symbols, code)
    quoted: bool = False  # a one-letter answer counts only quoted or alone


def load_questions() -> list[Question]:
    data = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    return [Question(q["q"], tuple(q["a"]), bool(q.get("case")), bool(q.get("quoted"))) for q in data["questions"]]


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _numbers(text: str) -> list[float]:
    return [n for m in _NUMBER.findall(text) if (n := _number(m)) is not None]


# Words after which a reply states a result: "= 12", "is 391", "equals 81", "answer: 5".
_CUE = re.compile(r"(?:=|\bis\b|\bequals\b|\bare\b|\bbe\b|:|\bgives\b|\bget\b|\bresult in\b)", re.I)


def _stated(reply: str) -> list[float]:
    """Numbers that follow a result cue within a few words, in order."""
    out: list[float] = []
    for cue in _CUE.finditer(reply):
        window = reply[cue.end() : cue.end() + 40]
        found = _NUMBER.search(window)
        if found is not None and len(window[: found.start()].split()) <= 3:
            value = _number(found.group())
            if value is not None:
                out.append(value)
    return out


def judge(q: Question, reply: str) -> bool:
    """Right when the reply gives one of the accepted answers.

    Numbers: the question's own numbers are left out (restating ``17 * 23`` says nothing);
    of the rest, the last one stated as a result ("= 12", "is 391") must equal the answer, or
    with no such statement the last number at all. Text: a whole-word match, case-insensitive
    unless the question says otherwise.
    """
    reply = reply.replace("**", "").replace("`", "'").replace("\\(", "").replace("\\)", "")
    for answer in q.answers:
        value = _number(answer)
        if value is not None:
            given = set(_numbers(q.question))
            stated = [n for n in _stated(reply) if n not in given]
            fresh = stated or [n for n in _numbers(reply) if n not in given]
            if fresh and fresh[-1] == value:
                return True
            continue
        flags = 0 if q.case else re.IGNORECASE
        if q.quoted:
            pattern = rf"(['\"]){re.escape(answer)}\1"
            if re.search(pattern, reply, flags) or reply.strip().strip(".") == answer:
                return True
            continue
        # Code answers: spacing does not matter ("['a','b']" is "['a', 'b']").
        squeeze = " " in answer or "," in answer
        text = re.sub(r"\s+", "", reply) if squeeze else reply
        target = re.sub(r"\s+", "", answer) if squeeze else answer
        if re.search(rf"(?<!\w){re.escape(target)}(?!\w)", text, flags):
            return True
    return False


async def _bounded(jobs: list[Callable[[], Awaitable[str]]], parallel: int) -> list[str]:
    gate = asyncio.Semaphore(parallel)

    async def run(job: Callable[[], Awaitable[str]]) -> str:
        async with gate:
            return await job()

    return await asyncio.gather(*(run(j) for j in jobs))


def direct_answers(
    model_path: Path, questions: list[Question], seeds: list[int | None], parallel: int, threads: int
) -> list[str]:
    """The baseline: the same GGUF through llama.cpp alone (xllamacpp), its own chat template
    applied by llama.cpp, the same sampling settings as the server's defaults, no reasoning."""
    import xllamacpp

    from kimi_server.settings import Settings

    defaults = Settings()
    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.n_ctx = 8192
    params.n_parallel = parallel
    if threads:
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
    params.use_jinja = True
    params.warmup = False
    params.verbosity = -1
    server = xllamacpp.Server(params)

    def ask(q: Question, seed: int | None) -> Callable[[], Awaitable[str]]:
        async def go() -> str:
            body: dict[str, Any] = {
                "messages": [{"role": "user", "content": q.question}],
                "max_tokens": 512,
                "temperature": defaults.temperature,
                "top_p": defaults.top_p,
            }
            if seed is not None:
                body["seed"] = seed
            out: Any = await asyncio.to_thread(server.handle_chat_completions, body)
            return str(out["choices"][0]["message"].get("content") or "")

        return go

    jobs = [ask(q, seed) for q, seed in zip(questions, seeds, strict=True)]
    return asyncio.run(_bounded(jobs, parallel))


def server_answers(
    base_url: str,
    key: str,
    questions: list[Question],
    seeds: list[int | None],
    effort: str | None,
    parallel: int,
) -> list[str]:
    from openai import AsyncOpenAI

    async def main() -> list[str]:
        client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=1800)

        def job(q: Question, seed: int | None) -> Callable[[], Awaitable[str]]:
            async def go() -> str:
                extra: dict[str, Any] = {"reasoning_effort": effort} if effort else {}
                if seed is not None:
                    extra["seed"] = seed
                resp = await client.chat.completions.create(
                    model="kimi-k3.1-pro",
                    messages=[{"role": "user", "content": q.question}],
                    **extra,
                )
                return resp.choices[0].message.content or ""

            return go

        try:
            jobs = [job(q, seed) for q, seed in zip(questions, seeds, strict=True)]
            return await _bounded(jobs, parallel)
        finally:
            await client.close()

    return asyncio.run(main())


def main() -> None:
    from benchmarks._server import KEY, running_server
    from kimi_server.models.pull import resolve_model
    from kimi_server.models.store import ModelStore, default_models_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--limit", type=int, default=0, help="only the first N questions")
    parser.add_argument("--rounds", type=int, default=2, help="times each question is asked")
    parser.add_argument("--parallel", type=int, default=4, help="requests in flight at once")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: one per core)")
    parser.add_argument("--slots", type=int, default=0, help="the server's slots (0: --parallel)")
    parser.add_argument("--show-wrong", action="store_true", help="print each wrong reply")
    parser.add_argument("--seed", type=int, default=1, help="first seed of the paired asks")
    parser.add_argument("--unpaired", action="store_true", help="send no seeds")
    args = parser.parse_args()
    questions = load_questions()
    if args.limit:
        questions = questions[: args.limit]
    questions = questions * max(1, args.rounds)
    seeds: list[int | None] = [None if args.unpaired else args.seed + i for i in range(len(questions))]
    path = resolve_model(args.model, ModelStore(default_models_dir()), auto_pull=True)

    scores: dict[str, int] = {}
    started = time.monotonic()

    def score(label: str, replies: list[str]) -> int:
        right = 0
        for q, reply in zip(questions, replies, strict=True):
            if judge(q, reply):
                right += 1
            elif args.show_wrong:
                print(f"  [{label}] {q.question} -> {reply[:160]!r}")
        return right

    replies = direct_answers(path, questions, seeds, args.parallel, args.threads)
    scores["direct"] = score("direct", replies)
    print(f"direct (llama.cpp, no reasoning): {scores['direct']}/{len(questions)}", flush=True)
    slots = str(args.slots or args.parallel)
    server_args = ("--parallel", slots, "--ctx-size", "8192", "--threads", str(args.threads))
    with running_server(args.model, *server_args) as url:
        for label, effort in (("low", "low"), ("default (max)", None)):
            t0 = time.monotonic()
            replies = server_answers(url, KEY, questions, seeds, effort, args.parallel)
            scores[label] = score(label, replies)
            took = time.monotonic() - t0
            print(f"kimi-server, effort {label}: {scores[label]}/{len(questions)} ({took:.0f} s)", flush=True)
    base = max(scores["direct"], 1)
    for label in ("low", "default (max)"):
        print(f"ratio {label} / direct: {scores[label] / base:.2f}")
    print(f"questions: {len(questions)}, total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
