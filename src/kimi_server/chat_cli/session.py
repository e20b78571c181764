"""The chat session's state and its slash commands, apart from any I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Endpoint = Literal["chat", "responses"]

HELP = """commands:
  /effort LEVEL   reasoning effort for the next turns (low, high, max; "default" to unset)
  /model ID       switch model
  /responses      use POST /v1/responses
  /chat           use POST /v1/chat/completions
  /reset          forget the conversation
  /help           this list
  /quit           leave (also Ctrl-D)"""


@dataclass
class Turn:
    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True)
class Efforts:
    """The reasoning efforts a model takes: its levels, and other spellings of them."""

    levels: tuple[str, ...]
    aliases: tuple[str, ...] = ()

    def accepts(self, effort: str) -> bool:
        return effort in self.levels or effort in self.aliases

    def words(self) -> str:
        return ", ".join(self.levels) + (f" (also {', '.join(self.aliases)})" if self.aliases else "")


@dataclass
class Session:
    model: str
    endpoint: Endpoint = "chat"
    effort: str | None = None  # None: the server's default
    system: str | None = None
    max_tokens: int | None = None  # None: the server's default
    history: list[Turn] = field(default_factory=list)
    # The models the server lists, each with its efforts where known (None: not said). Empty:
    # the list is unknown, and /model takes any id.
    models: dict[str, Efforts | None] = field(default_factory=dict)

    def effort_refusal(self, model: str, effort: str | None) -> str | None:
        """Why ``effort`` cannot go with ``model``, in words; None when it can (or is unknown)."""
        efforts = self.models.get(model)
        if effort is None or efforts is None or efforts.accepts(effort):
            return None
        return f"{model} takes effort {efforts.words()}; not {effort}"

    def chat_messages(self, prompt: str) -> list[dict[str, Any]]:
        """The whole conversation as Chat Completions messages, ending with ``prompt``."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
        messages += [{"role": t.role, "content": t.text} for t in self.history]
        messages.append({"role": "user", "content": prompt})
        return messages

    def response_input(self, prompt: str) -> list[dict[str, Any]]:
        """The whole conversation as Responses input items: the server keeps no state, so the
        earlier turns travel with each request (it refuses ``previous_response_id``)."""
        items = [{"type": "message", "role": t.role, "content": t.text} for t in self.history]
        items.append({"type": "message", "role": "user", "content": prompt})
        return items

    def remember(self, prompt: str, answer: str) -> None:
        self.history += [Turn("user", prompt), Turn("assistant", answer)]


@dataclass(frozen=True)
class Outcome:
    """What a slash command did: a line to show, and whether to leave."""

    message: str
    quit: bool = False


def run_command(session: Session, line: str) -> Outcome:
    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    match name.lower():
        case "/quit" | "/exit" | "/q":
            return Outcome("bye", quit=True)
        case "/help" | "/?":
            return Outcome(HELP)
        case "/reset":
            session.history.clear()
            return Outcome("conversation cleared")
        case "/responses":
            session.endpoint = "responses"
            return Outcome("endpoint: /v1/responses")
        case "/chat":
            session.endpoint = "chat"
            return Outcome("endpoint: /v1/chat/completions")
        case "/effort":
            return _effort(session, arg)
        case "/model":
            return _model(session, arg)
    return Outcome(f"unknown command {name}; /help lists them")


def _effort(session: Session, arg: str) -> Outcome:
    if not arg:
        return Outcome(f"effort: {session.effort or 'server default'} (usage: /effort LEVEL)")
    effort = None if arg.lower() == "default" else arg
    # Checked now, not by the next turn's 400: the effort stays as it was.
    refusal = session.effort_refusal(session.model, effort)
    if refusal is not None:
        return Outcome(f"{refusal}; effort stays {session.effort or 'server default'}")
    session.effort = effort
    return Outcome(f"effort: {session.effort or 'server default'}")


def _model(session: Session, arg: str) -> Outcome:
    if not arg:
        return Outcome(f"model: {session.model} (usage: /model ID)")
    if session.models and arg not in session.models:
        return Outcome(f"the server lists no model {arg}; it serves {', '.join(session.models)}")
    refusal = session.effort_refusal(arg, session.effort)
    if refusal is not None:
        return Outcome(f"{refusal}: choose an effort it takes first (/effort default), model stays {session.model}")
    session.model = arg
    return Outcome(f"model: {arg}")
