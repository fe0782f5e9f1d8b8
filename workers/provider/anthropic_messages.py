"""The scripted provider's Anthropic Messages route (`POST /v1/messages`): the same scenario
files, matched on the same conversation, answered in Anthropic's shape.

A Messages request becomes the chat request the matcher already reads (the top-level system
prompt, `tool_use` blocks as assistant tool calls, `tool_result` blocks as tool messages),
so a script matches the same way whichever API asks; its reply goes back as content blocks
with `stop_reason` and `usage.input_tokens/output_tokens`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from workers.provider.request import ChatRequest
from workers.provider.wire import RenderedReply

STOP = {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def to_chat(body: dict[str, Any]) -> ChatRequest:
    """The chat request a Messages body stands for (ValidationError if it stands for none)."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    if system:
        messages.append({"role": "system", "content": system})
    for turn in body.get("messages") or []:
        messages += _messages(turn)
    tools = [
        {
            "type": "function",
            "function": {"name": t.get("name"), "parameters": t.get("input_schema")},
        }
        for t in body.get("tools") or []
    ]
    return ChatRequest.model_validate(
        {
            "model": body.get("model"),
            "messages": messages,
            "tools": tools or None,
            "max_tokens": body.get("max_tokens"),
            "temperature": body.get("temperature"),
        }
    )


def _messages(turn: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = turn.get("role"), turn.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = [b for b in content or [] if isinstance(b, dict)]
    text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    if role == "assistant":
        calls = [
            {
                "id": b.get("id"),
                "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {})},
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        return [{"role": "assistant", "content": text or None, "tool_calls": calls or None}]
    out = [
        {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _result_text(b)}
        for b in blocks
        if b.get("type") == "tool_result"
    ]
    if text or not out:
        out.append({"role": "user", "content": text})
    return out


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content or "")


def message_body(request: ChatRequest, reply: RenderedReply) -> dict[str, Any]:
    """The Messages response around one rendered reply."""
    content: list[dict[str, Any]] = []
    text = reply.message.get("content")
    if text:
        content.append({"type": "text", "text": text})
    for call in reply.message.get("tool_calls") or []:
        function = call["function"]
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": json.loads(function.get("arguments") or "{}"),
            }
        )
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": STOP.get(reply.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens},
    }


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
