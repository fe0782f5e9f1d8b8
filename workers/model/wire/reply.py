"""What one model request carries besides the conversation, and what comes back: the same
for every API the client speaks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from workers.state import Message
from workers.usage import Usage


class RequestParams(BaseModel):
    """Per-request settings: a bound on the reply's length and its randomness."""

    max_tokens: int | None = None
    temperature: float | None = None
    # OpenAI's newer models take `max_completion_tokens`; most other servers `max_tokens`.
    token_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"

    def body(self) -> dict[str, Any]:
        """The fields these settings add to a chat-completions request."""
        out: dict[str, Any] = {}
        if self.max_tokens is not None:
            out[self.token_param] = self.max_tokens
        if self.temperature is not None:
            out["temperature"] = self.temperature
        return out


class ModelReply(BaseModel):
    """One reply: the assistant message, its usage, and why it finished."""

    message: Message
    usage: Usage
    finish_reason: str | None = None
    service_ms: float | None = None
