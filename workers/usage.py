"""Token usage: what one reply reported, and what a run has added up."""

from __future__ import annotations

from pydantic import BaseModel


class Usage(BaseModel):
    """Tokens one model reply reported (the provider's numbers, not ours)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The reply carried no usage: these are our own o200k_base counts, so budgets still hold.
    estimated: bool = False
    # The request waited for a slot of the endpoint's cap (LLM_MAX_INFLIGHT, LLM_MAX_TPM).
    waited: bool = False

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


class RunUsage(Usage):
    """Tokens and calls a whole run has spent, summed over its replies."""

    requests: int = 0
    estimated_requests: int = 0  # replies whose usage we counted ourselves
    waited_requests: int = 0  # requests that waited for the endpoint's cap

    def add(self, reply: Usage) -> None:
        """Add one reply's usage to the run's totals."""
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.requests += 1
        self.estimated_requests += reply.estimated
        self.waited_requests += reply.waited
        self.estimated = self.estimated or reply.estimated
