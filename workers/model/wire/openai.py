"""OpenAI chat completions on the wire (OpenAI, vLLM, llama.cpp's server, Ollama, LiteLLM):
the request body, and the reply read tolerantly of the shapes real servers send."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from workers.errors import ProviderError
from workers.model.wire.reply import ModelReply, RequestParams
from workers.state import Message
from workers.tokens import count, of_request
from workers.usage import Usage

PATH = "chat/completions"


def headers(api_key: str | None) -> dict[str, str]:
    """Bearer authentication, when there is a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def body(
    model: str, messages: list[Message], tools: list[dict[str, Any]], params: RequestParams | None
) -> dict[str, Any]:
    """A chat-completions request."""
    out: dict[str, Any] = {"model": model, "messages": [m.wire() for m in messages]}
    if tools:
        out["tools"] = tools
    if params is not None:
        out |= params.body()
    return out


def parse(
    data: Any, where: str, messages: list[Message], tools: list[dict[str, Any]]
) -> ModelReply:
    """One reply; `ProviderError` if it is not one."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices:
        raise ProviderError(f"{where} sent a reply with no choices: {str(data)[:200]}")
    try:
        choice = choices[0]
        message = Message.model_validate(_tolerant(choice.get("message") or {}))
    except (AttributeError, TypeError, ValidationError) as exc:
        raise ProviderError(f"{where} sent a malformed reply: {exc}") from exc
    return ModelReply(
        message=message,
        usage=_usage(data.get("usage"), message, messages, tools),
        finish_reason=choice.get("finish_reason"),
    )


def error_text(data: Any) -> str | None:
    """The message of an error body (`{"error": {"message": ...}}`), if it is one."""
    try:
        return str(data["error"]["message"])
    except (KeyError, TypeError):
        return None


def _tolerant(raw: dict[str, Any]) -> dict[str, Any]:
    """The shape differences of real servers, smoothed: `content` null or missing, a tool
    call without `type` or `id`, `arguments` as an object instead of a JSON string."""
    message = {"role": "assistant", "content": raw.get("content")}
    calls = []
    for i, call in enumerate(raw.get("tool_calls") or []):
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if arguments is None or arguments == "":
            function["arguments"] = "{}"
        elif not isinstance(arguments, str):
            function["arguments"] = json.dumps(arguments)
        calls.append({"id": call.get("id") or f"call_{i}", "function": function})
    if calls:
        message["tool_calls"] = calls
    return message


def _usage(
    raw: Any, message: Message, messages: list[Message], tools: list[dict[str, Any]]
) -> Usage:
    """The server's usage, or our own count of the request and reply (marked estimated)."""
    if isinstance(raw, dict) and ("prompt_tokens" in raw or "completion_tokens" in raw):
        return Usage(
            prompt_tokens=int(raw.get("prompt_tokens") or 0),
            completion_tokens=int(raw.get("completion_tokens") or 0),
        )
    return estimate(message, messages, tools)


def estimate(message: Message, messages: list[Message], tools: list[dict[str, Any]]) -> Usage:
    """Our o200k_base count of a request and its reply, marked estimated."""
    prompt = of_request([m.wire() for m in messages], tools)
    reply = json.dumps(message.wire())
    return Usage(prompt_tokens=prompt, completion_tokens=count(reply), estimated=True)
