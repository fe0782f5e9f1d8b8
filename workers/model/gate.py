"""When a request may go: the hook through which an endpoint's shared caps hold it back.

The model client asks a `Gate` (coordination/ratecap.py: requests in flight and tokens per minute
shared by every worker on every machine, and a cool-down after a 429) before each request
and tells it, after, how many tokens the request really used. Without a gate a request goes
at once, as it always did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from workers.cancel import CancelToken

# Told when a request starts waiting, with the cap it waits for (`inflight`, `tpm`, or
# `cool`: a 429's Retry-After), and with None when it stops (it may go, or was cancelled).
OnWait = Callable[[str | None], None]


class Slot(Protocol):
    """One request's place under the caps, held until it is answered."""

    waited: bool  # the request waited for a slot, the token rate or a cool-down

    def done(self, tokens: int | None) -> None:
        """The request ended: its slot goes back; `tokens` it really used (None: unknown,
        what was counted before stands)."""


class Gate(Protocol):
    """An endpoint's caps, shared by every worker."""

    counts_tokens: bool  # whether `enter` needs the request's tokens (a token rate is set)

    def enter(
        self, model: str, tokens: int, cancel: CancelToken | None, on_wait: OnWait | None = None
    ) -> Slot:
        """Wait until a request of `tokens` (prompt and the longest reply) may go; a cancel
        stops the wait (`Cancelled`). `on_wait` hears when a wait starts and ends."""

    def cool_down(self, model: str, seconds: float) -> None:
        """The endpoint said 429, Retry-After `seconds`: no worker sends before then."""
