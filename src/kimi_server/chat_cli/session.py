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


@dataclass
class Session:
    model: str
    endpoint: Endpoint = "chat"
    effort: str | None = None  # None: the server's default
    system: str | None = None
    max_tokens: int | None = None  # None: the server's default
    history: list[Turn] = field(default_factory=list)

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
            if not arg:
                return Outcome(f"effort: {session.effort or 'server default'} (usage: /effort LEVEL)")
            session.effort = None if arg.lower() == "default" else arg
            return Outcome(f"effort: {session.effort or 'server default'}")
        case "/model":
            if not arg:
                return Outcome(f"model: {session.model} (usage: /model ID)")
            session.model = arg
            return Outcome(f"model: {arg}")
    return Outcome(f"unknown command {name}; /help lists them")
