"""The scripted provider's side of the wire: the reply it renders to a request (request.py).

`render_reply` fills a scripted reply's placeholders and reports its usage, fixed or
counted by the one rule in `prompt_tokens`. Plain code over plain data, like `scenario.py`:
no HTTP lives here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from workers import tokens
from workers.provider.request import ChatRequest, ConversationView
from workers.provider.scenario import Reply, ToolCallSpec, fill, map_strings

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
