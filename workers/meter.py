"""What a model call may cost before it is made, and the hook that may refuse it.

The harness knows nothing of where money is counted: a `Meter` (the run's budget ledger,
orchestrator/coordination/budget.py) is asked to `hold` a call's worst case before the call starts
and told what the reply really cost after it. A meter that cannot cover the call raises
`OverBudget` and the call is not made; the run stops `budget_exceeded`, resumable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from workers.pricing import PER_MILLION, Price
from workers.state import Message
from workers.tokens import of_request
from workers.usage import Usage

# The reply's length when a request sets no max_tokens: a worst case must be finite.
UNBOUNDED_REPLY_TOKENS = 4096


class OverBudget(Exception):
    """The call was not started: what is left cannot cover its worst case (or the ledger
    that says so cannot be reached, and a meter fails closed)."""


@dataclass(frozen=True)
class WorstCase:
    """A call's worst case: its prompt counted with o200k_base (as the wire JSON, which
    counts more than any server's framing does) and a reply of max_tokens."""

    prompt_tokens: int
    reply_tokens: int
    usd: float


def worst_tokens(
    messages: list[Message], tools: list[dict[str, Any]], max_tokens: int | None
) -> tuple[int, int]:
    """The most tokens one request of `messages` and `tools` can use: (prompt, reply)."""
    return of_request([m.wire() for m in messages], tools), max_tokens or UNBOUNDED_REPLY_TOKENS


def worst_case(
    messages: list[Message], tools: list[dict[str, Any]], max_tokens: int | None, price: Price
) -> WorstCase:
    """The most one request of `messages` and `tools` can cost at `price`."""
    prompt_tokens, reply_tokens = worst_tokens(messages, tools, max_tokens)
    usd = (
        prompt_tokens * price.input_per_million + reply_tokens * price.output_per_million
    ) / PER_MILLION
    return WorstCase(prompt_tokens, reply_tokens, usd)


class Hold(Protocol):
    """Money set aside for one call in flight."""

    def settle(self, usd: float, usage: Usage) -> None:
        """The reply came: what it cost replaces what was held."""

    def release(self) -> None:
        """The call got no reply: what was held goes back."""


class Meter(Protocol):
    """Where a run's money is counted across every worker."""

    def hold(self, worst: WorstCase) -> Hold:
        """Set `worst.usd` aside for one call, or raise `OverBudget`."""
