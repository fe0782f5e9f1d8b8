"""Token usage: what one reply reported, and what a run has added up."""

from __future__ import annotations

from pydantic import BaseModel


class Usage(BaseModel):
    """Tokens one model reply reported (the provider's numbers, not ours)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


class RunUsage(Usage):
    """Tokens and calls a whole run has spent, summed over its replies."""

    requests: int = 0

    def add(self, reply: Usage) -> None:
        """Add one reply's usage to the run's totals."""
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.requests += 1
