"""The scripted provider's side of the wire: the request it reads and the reply it renders.

`ConversationView` is what `when` regexes see of a request; `render_reply` fills a scripted
reply's placeholders and reports its usage, fixed or counted by the one rule in
`prompt_tokens`. Plain code over plain data, like `scenario.py`: no HTTP lives here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, Field

from workers import tokens
from workers.provider.scenario import Reply, ToolCallSpec, fill, map_strings

# --- the request, as the matcher sees it ---------------------------------------------------


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


# --- rendering a reply, and counting its tokens --------------------------------------------

# OpenAI's published guidance for chat models: every message costs 3 tokens of framing
# (role and delimiters) besides its content, and every reply is primed with 3 more.
TOKENS_PER_MESSAGE = 3
TOKENS_REPLY_PRIMING = 3


def prompt_tokens(request: ChatRequest) -> int:
    """Counted prompt tokens (o200k_base), the one rule the provider uses.

    sum over messages of (TOKENS_PER_MESSAGE + count(text) + sum over the message's tool
    calls of (count(name) + count(arguments))) + TOKENS_REPLY_PRIMING + count(tools JSON),
    where the tools JSON is `json.dumps(tools, separators=(",", ":"))` and is only counted
    when the request lists tools. Roles and `name`/`tool_call_id` fields are not counted.
    """
    total = TOKENS_REPLY_PRIMING
    for message in request.messages:
        total += TOKENS_PER_MESSAGE + tokens.count(message.text())
        total += _calls_tokens([call.model_dump() for call in message.tool_calls or []])
    if request.tools:
        total += tokens.count(json.dumps(request.tools, separators=(",", ":")))
    return total


def _calls_tokens(calls: list[dict[str, Any]]) -> int:
    """Tokens of wire-format tool calls: each call's name plus its argument string."""
    return sum(
        tokens.count(call["function"]["name"]) + tokens.count(call["function"]["arguments"])
        for call in calls
    )


@dataclass(frozen=True)
class RenderedReply:
    """A reply ready for the wire: the assistant message, why it stopped, and its usage."""

    message: dict[str, Any]
    finish_reason: Literal["stop", "tool_calls", "length"]
    prompt_tokens: int
    completion_tokens: int


def render_reply(
    reply: Reply, request: ChatRequest, groups: Mapping[str, str] | None = None
) -> RenderedReply:
    """Turn a scripted reply into an OpenAI assistant message with usage (fixed or counted);
    a text longer than the request's token cap is cut there (`finish_reason: length`)."""
    groups = groups or {}
    text = _text(reply, request, groups)
    text, cut = _capped(text, request.reply_cap)
    calls = _wire_calls(reply, request.turn, groups)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    if reply.usage is not None:
        prompt, completion = reply.usage.prompt_tokens, reply.usage.completion_tokens
        if cut and request.reply_cap is not None:
            completion = min(completion, request.reply_cap)
    else:
        prompt = prompt_tokens(request)
        completion = tokens.count(text or "") + _calls_tokens(calls)
    finish = "length" if cut else "tool_calls" if calls else "stop"
    return RenderedReply(message, finish, prompt, completion)


def _text(reply: Reply, request: ChatRequest, groups: Mapping[str, str]) -> str | None:
    """The reply's text with its placeholders filled (a `lines` reply's, made from the
    request's first user message)."""
    if reply.lines is not None:
        return reply.answer_lines(ConversationView.of(request).user, groups)
    return None if reply.text is None else fill(reply.text, groups)


def _capped(text: str | None, cap: int | None) -> tuple[str | None, bool]:
    """`text` cut at `cap` o200k_base tokens, and whether it was cut."""
    if text is None or cap is None or len(text.encode("utf-8")) <= cap:
        return text, False  # a token is a byte at least: no need to build the tokenizer
    encoded = tokens.encoding().encode(text, disallowed_special=())
    if len(encoded) <= cap:
        return text, False
    return tokens.encoding().decode(encoded[:cap]), True


def _wire_calls(reply: Reply, turn: int, groups: Mapping[str, str]) -> list[dict[str, Any]]:
    """The reply's tool calls in wire format, with `{turn}` and placeholders filled."""
    return [
        {
            "id": fill(call.id.replace("{turn}", str(turn)), groups),
            "type": "function",
            "function": {"name": call.name, "arguments": _arguments(call, groups)},
        }
        for call in reply.tool_calls or []
    ]


def _arguments(call: ToolCallSpec, groups: Mapping[str, str]) -> str:
    """The call's arguments as the JSON string the wire carries (a mapping is dumped compact)."""
    arguments = (
        map_strings(call.arguments, lambda text: fill(text, groups)) if groups else call.arguments
    )
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
