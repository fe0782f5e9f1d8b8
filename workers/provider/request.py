"""The request the scripted provider reads, as the matcher sees it.

`ChatRequest` is the part of a chat-completions body the provider reads; `ConversationView`
is what `when` regexes see of it. Both the scenario's matcher (scenario.py) and the reply's
rendering (wire.py) read these, so they live below both: no import circle between them.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, Field


class WireFunction(BaseModel):
    """The `function` of an assistant tool call on the wire."""

    name: str
    arguments: str = ""


class WireToolCall(BaseModel):
    """An assistant tool call on the wire."""

    id: str
    type: Literal["function"] = "function"
    function: WireFunction


class WireMessage(BaseModel):
    """One chat message on the wire (unknown keys are allowed, as real clients send them)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[WireToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; content parts of type `text` are joined."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatRequest(BaseModel):
    """The part of a chat-completions request body the provider reads."""

    model: str
    messages: list[WireMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    # A client's request settings, as sent: counted in /stats (`params`); a text reply
    # longer than the token cap is cut there.
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None

    @property
    def params(self) -> str:
        """The request settings this request carried, e.g. `max_tokens=512 temperature=0.0`."""
        names = ("max_tokens", "max_completion_tokens", "temperature")
        sent = [f"{n}={getattr(self, n)}" for n in names if getattr(self, n) is not None]
        return " ".join(sent) or "none"

    @property
    def reply_cap(self) -> int | None:
        """The most tokens the reply may have: the smaller cap the request set, if any."""
        caps = [c for c in (self.max_tokens, self.max_completion_tokens) if c is not None]
        return min(caps) if caps else None

    @property
    def turn(self) -> int:
        """Turn index: how many assistant messages the request already holds."""
        return sum(1 for m in self.messages if m.role == "assistant")


def protocol_error(request: ChatRequest) -> str | None:
    """Why the request breaks the tool-call rules a strict endpoint enforces (OpenAI's and
    Anthropic's APIs do), or None: each call of an assistant message answered by exactly
    one tool message before the next other message, no tool message that answers no call,
    and no call id used twice in the conversation."""
    seen: set[str] = set()
    unanswered: list[str] = []
    for message in request.messages:
        if message.role == "tool":
            if message.tool_call_id not in unanswered:
                return (
                    f"a tool message answers {message.tool_call_id!r}, which no preceding "
                    "assistant message asked for, or which was answered already"
                )
            unanswered.remove(message.tool_call_id)
            continue
        if unanswered:
            break
        for call in message.tool_calls or []:
            if call.id in seen:
                return f"tool call id {call.id!r} is used by more than one call"
            seen.add(call.id)
            unanswered.append(call.id)
    if unanswered:
        return (
            "an assistant message with tool_calls must be followed by tool messages responding "
            f"to each tool_call_id; these have none: {', '.join(unanswered)}"
        )
    return None


class ConversationView:
    """The texts `when` regexes are matched against, each built on first read, then kept."""

    def __init__(self, request: ChatRequest) -> None:
        self.model = request.model
        self._messages = request.messages

    @classmethod
    def of(cls, request: ChatRequest) -> ConversationView:
        """The view of one request (build it once per request and match with it)."""
        return cls(request)

    @cached_property
    def system(self) -> str:
        """The system and developer messages, one per line."""
        return "\n".join(m.text() for m in self._messages if m.role in ("system", "developer"))

    @cached_property
    def user(self) -> str:
        """The first user message."""
        return next((m.text() for m in self._messages if m.role == "user"), "")

    @cached_property
    def transcript(self) -> str:
        """Every message, one per line; tool calls enter as `name arguments` lines."""
        lines: list[str] = []
        for message in self._messages:
            lines.append(message.text())
            lines.extend(
                f"{c.function.name} {c.function.arguments}" for c in message.tool_calls or []
            )
        return "\n".join(lines)

    @cached_property
    def tool_results(self) -> str:
        """The tool messages, one per line."""
        return "\n".join(m.text() for m in self._messages if m.role == "tool")
