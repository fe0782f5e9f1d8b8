"""Anthropic Messages on the wire (`POST /v1/messages`), mapped to and from the harness's
OpenAI-shaped transcript.

The system prompt goes top-level; assistant tool calls become `tool_use` blocks and tool
results `tool_result` blocks in the next user message; tools are sent with `input_schema`.
A reply's `stop_reason` maps to the finish reasons the loop knows: `tool_use` → tool_calls,
`end_turn`/`stop_sequence` → stop, `max_tokens` → length. Authentication is `x-api-key`
with an `anthropic-version`; `max_tokens` is required, so a default is always sent.
"""

from __future__ import annotations

import json
from typing import Any

from workers.errors import ProviderError
from workers.model.wire.openai import estimate
from workers.model.wire.reply import ModelReply, RequestParams
from workers.state import FunctionCall, Message, ToolCall
from workers.usage import Usage

PATH = "messages"
VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 1024
FINISH = {
    "tool_use": "tool_calls",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
}


def headers(api_key: str | None) -> dict[str, str]:
    """The API key header (when there is a key) and the API version."""
    out = {"anthropic-version": VERSION}
    if api_key:
        out["x-api-key"] = api_key
    return out


def body(
    model: str, messages: list[Message], tools: list[dict[str, Any]], params: RequestParams | None
) -> dict[str, Any]:
    """A Messages request for the same conversation."""
    system = "\n\n".join(m.content or "" for m in messages if m.role == "system")
    out: dict[str, Any] = {
        "model": model,
        "max_tokens": (params.max_tokens if params else None) or DEFAULT_MAX_TOKENS,
        "messages": _turns([m for m in messages if m.role != "system"]),
    }
    if system:
        out["system"] = system
    if params is not None and params.temperature is not None:
        out["temperature"] = params.temperature
    if tools:
        out["tools"] = [_tool(t) for t in tools]
    return out


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function", tool)
    return {
        "name": function["name"],
        "description": function.get("description", ""),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }


def _turns(messages: list[Message]) -> list[dict[str, Any]]:
    """Alternating user/assistant messages of content blocks; tool results join the user
    turn that follows the call."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            for call in message.tool_calls or []:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.function.name,
                        "input": _input(call.function.arguments),
                    }
                )
            turns.append({"role": "assistant", "content": blocks or [{"type": "text", "text": ""}]})
            continue
        if message.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content or "",
            }
        else:
            block = {"type": "text", "text": message.content or ""}
        if turns and turns[-1]["role"] == "user":
            turns[-1]["content"].append(block)
        else:
            turns.append({"role": "user", "content": [block]})
    return turns


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return {}


def parse(
    data: Any, where: str, messages: list[Message], tools: list[dict[str, Any]]
) -> ModelReply:
    """One Messages reply as the harness's assistant message."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise ProviderError(f"{where} sent a reply with no content blocks: {str(data)[:200]}")
    texts, calls = [], []
    for block in data["content"]:
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            calls.append(
                ToolCall(
                    id=str(block.get("id") or f"call_{len(calls)}"),
                    function=FunctionCall(name=str(block.get("name")), arguments=arguments),
                )
            )
    message = Message(role="assistant", content="".join(texts) or None, tool_calls=calls or None)
    raw = data.get("usage")
    if isinstance(raw, dict) and ("input_tokens" in raw or "output_tokens" in raw):
        usage = Usage(
            prompt_tokens=int(raw.get("input_tokens") or 0),
            completion_tokens=int(raw.get("output_tokens") or 0),
        )
    else:
        usage = estimate(message, messages, tools)
    stop = data.get("stop_reason")
    return ModelReply(message=message, usage=usage, finish_reason=FINISH.get(stop, stop))


def error_text(data: Any) -> str | None:
    """The message of an error body (`{"type": "error", "error": {"message": ...}}`)."""
    try:
        return str(data["error"]["message"])
    except (KeyError, TypeError):
        return None
