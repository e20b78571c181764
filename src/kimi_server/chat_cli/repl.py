"""The chat loop: read a line, stream the turn, keep the history, until /quit or EOF."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import openai
import typer
from rich.console import Console

from kimi_server.chat_cli.errors import one_line
from kimi_server.chat_cli.session import Efforts, Session, run_command
from kimi_server.chat_cli.stream import Done, StreamFailed, turn
from kimi_server.policy.catalogue import CATALOGUE, find_model
from kimi_server.settings import Settings


def run(
    url: str,
    key: str | None,
    model: str | None,
    effort: str | None,
    responses: bool,
    hide_reasoning: bool,
    system: str | None,
    max_tokens: int | None = None,
) -> None:
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    client = openai.OpenAI(base_url=url, api_key=key or _default_key() or "none", max_retries=0)
    session = _open_session(client, url, err, model, effort)
    session.endpoint = "responses" if responses else "chat"
    session.system, session.max_tokens = system, max_tokens
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    out.print(f"{session.model} at {url} — /help for commands, /quit to leave", style="dim", markup=False)
    while True:
        try:
            line = input("> " if interactive else "")
        except (EOFError, KeyboardInterrupt):
            out.print()
            return
        if not line.strip():
            continue
        if line.startswith("/"):
            outcome = run_command(session, line)
            out.print(outcome.message, style="dim", markup=False)
            if outcome.quit:
                return
            continue
        try:
            answer = _show_turn(out, client, session, line, hide_reasoning, interactive)
        except KeyboardInterrupt:
            out.print("\n(interrupted; this turn is not kept)", style="dim")
            continue
        except (openai.OpenAIError, StreamFailed) as exc:
            out.print()
            err.print(f"error: {one_line(exc, url)}", style="red", markup=False)
            continue
        session.remember(line, answer)


def _show_turn(
    out: Console, client: openai.OpenAI, session: Session, prompt: str, hide_reasoning: bool, interactive: bool
) -> str:
    """Streams one turn to the terminal; returns the answer, which joins the history."""
    answer: list[str] = []
    thought = 0  # reasoning pieces seen: the count to show when the server reports none
    showing = ""  # what is being printed: "", "reasoning" or "answer"
    for event in turn(client, session, prompt):
        if isinstance(event, Done):
            if hide_reasoning and thought:
                tokens = event.reasoning_tokens if event.reasoning_tokens is not None else f"~{thought}"
                out.print(f"\n(thought for {tokens} tokens)", style="dim", end="")
            break
        if event.kind == "reasoning":
            thought += 1
            if hide_reasoning:
                if thought == 1 and interactive:
                    out.print("thinking…", style="dim", end="")
                continue
            out.print(event.text, style="dim", end="", markup=False)
            showing = "reasoning"
            continue
        if showing != "answer":
            if showing == "reasoning":
                out.print("\n")
            elif hide_reasoning and thought and interactive:
                out.file.write("\r\x1b[K")  # the "thinking…" line gives way to the answer
            showing = "answer"
        answer.append(event.text)
        out.print(event.text, end="", markup=False)
    out.print()
    return "".join(answer)


def _default_key() -> str | None:
    for name in ("KIMI_API_KEY", "OPENAI_API_KEY"):
        if os.environ.get(name):
            return os.environ[name]
    # The key a local `kimi-server serve` made for itself when started without any.
    default_dir = Settings.model_fields["data_dir"].get_default(call_default_factory=True)
    path = Path(os.environ.get("KIMI_DATA_DIR") or str(default_dir)) / "dev-api-key"
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _open_session(client: openai.OpenAI, url: str, err: Console, model: str | None, effort: str | None) -> Session:
    """The session's model and effort, checked against the server's list before any turn."""
    try:
        listed = _listed(client, required=model is None)
        session = Session(model=model or _pick_model(listed), models=listed)
    except openai.OpenAIError as exc:
        err.print(f"error: {one_line(exc, url)}", style="red", markup=False)
        raise typer.Exit(1) from None
    refusal = _refused_choice(session, effort)
    if refusal is not None:
        err.print(f"error: {refusal}", style="red", markup=False)
        raise typer.Exit(2)
    session.effort = effort
    return session


def _refused_choice(session: Session, effort: str | None) -> str | None:
    """Why the model or effort given on the command line cannot be used, checked before any
    turn; None when they can."""
    if session.models and session.model not in session.models:
        return f"--model: the server lists no model {session.model}; it serves {', '.join(session.models)}"
    refusal = session.effort_refusal(session.model, effort)
    return f"--effort: {refusal}" if refusal is not None else None


def _listed(client: openai.OpenAI, *, required: bool) -> dict[str, Efforts | None]:
    """The models the server lists, each with the efforts it takes: as the server says
    (``reasoning_efforts`` in kimi-server's list), else the catalogue's for its ids, else
    unknown. ``required``: a failed listing is an error (no --model to go on with)."""
    try:
        models = list(client.models.list())
    except openai.OpenAIError:
        if required:
            raise
        return {}
    return {m.id: _efforts(m.id, m.model_extra or {}) for m in models}


def _efforts(model_id: str, extra: dict[str, Any]) -> Efforts | None:
    levels, aliases = extra.get("reasoning_efforts"), extra.get("reasoning_effort_aliases")
    if isinstance(levels, list) and all(isinstance(x, str) for x in levels):
        return Efforts(tuple(levels), tuple(str(a) for a in aliases) if isinstance(aliases, dict) else ())
    spec = find_model(model_id)
    return Efforts(spec.efforts, tuple(spec.effort_aliases)) if spec is not None else None


def _pick_model(listed: dict[str, Efforts | None]) -> str:
    """The first catalogue model the server lists, else its first model (Moonshot's list, say)."""
    for spec in CATALOGUE:
        if spec.id in listed:
            return spec.id
    if not listed:
        raise openai.OpenAIError("the server lists no models; pass --model")
    return next(iter(listed))
